//! `cargo xtask config-docs`: the settings table of `docs/configuration.md`, rendered from
//! the settings of `intercept serve` ([`intercept_cli::config::SETTINGS`]).
//!
//! The table sits between two marker comments; [`render`] replaces what is between them
//! and [`write()`] saves the result. `cargo xtask tidy` fails when the committed table is
//! not the rendered one (rule `config-docs`), so the page cannot drift from the code.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// The line before the table.
pub const BEGIN: &str = "<!-- settings table: generated from intercept_cli::config::SETTINGS by \
                         `cargo xtask config-docs`; edit the settings there, not here -->";

/// The line after the table.
pub const END: &str = "<!-- end of settings table -->";

/// The page that holds the table.
pub fn page(root: &Path) -> PathBuf {
    root.join("docs/configuration.md")
}

/// `text` (the page) with the table between the markers rendered from the settings.
pub fn render(text: &str) -> Result<String> {
    let begin = text
        .find(BEGIN)
        .with_context(|| format!("no line `{BEGIN}`"))?;
    let table_start = begin + BEGIN.len();
    let end = text[table_start..]
        .find(END)
        .map(|i| table_start + i)
        .with_context(|| format!("no line `{END}` after `{BEGIN}`"))?;
    Ok(format!(
        "{}\n{}{}",
        &text[..table_start],
        intercept_cli::config::settings_table(),
        &text[end..]
    ))
}

/// Rewrites the table of `docs/configuration.md` from the settings.
pub fn write(root: &Path) -> Result<()> {
    let path = page(root);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let rendered = render(&text).with_context(|| path.display().to_string())?;
    if rendered == text {
        println!("config-docs: {} is up to date", path.display());
        return Ok(());
    }
    fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "config-docs: rewrote the settings table of {}",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_between_the_markers_only() {
        let page = format!("# Title\n\nbefore\n\n{BEGIN}\n| old |\n{END}\n\nafter\n");
        let out = render(&page).unwrap();
        assert!(out.starts_with(&format!("# Title\n\nbefore\n\n{BEGIN}\n| key |")));
        assert!(out.ends_with(&format!("|\n{END}\n\nafter\n")), "{out}");
        assert!(!out.contains("| old |"));
        assert_eq!(render(&out).unwrap(), out, "rendering is idempotent");
        assert!(render("no markers").is_err());
    }
}
