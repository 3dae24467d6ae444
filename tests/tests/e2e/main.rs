//! End-to-end tests across crates: real clients, real HTTP, the mock model upstream.

mod anthropic;
mod openai_chat;
mod responses;
