//! End-to-end tests across crates: real clients, real HTTP, the mock model upstream.

mod openai_chat;
