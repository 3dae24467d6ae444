//! The renderers by name: [`renderer`] builds the one a name picks. It sits above
//! [`Renderer`] and each renderer that implements it, so neither depends on the other's
//! module for it.

use std::sync::Arc;

use crate::qwen3::Qwen3Renderer;
use crate::render::{Renderer, RendererError, RendererOptions};
use crate::tokenizer::Tokenizer;

/// The names [`renderer`] knows.
pub const RENDERERS: &[&str] = &["qwen3"];

/// The renderer named `name` over `tokenizer`.
pub fn renderer(
    name: &str,
    tokenizer: Arc<Tokenizer>,
    options: &RendererOptions,
) -> Result<Arc<dyn Renderer>, RendererError> {
    match name {
        "qwen3" => Ok(Arc::new(Qwen3Renderer::new(tokenizer, options.clone())?)),
        _ => Err(RendererError::UnknownRenderer {
            name: name.to_owned(),
            known: RENDERERS.to_vec(),
        }),
    }
}
