//! The settings table of `docs/configuration.md` is the one rendered from the settings of
//! `intercept serve` ([`intercept_cli::config::settings_table`]), so the page cannot drift
//! from the code. With `INTERCEPT_WRITE_CONFIG_DOCS=1` (what `cargo xtask config-docs`
//! sets) the test rewrites the table instead of failing.

use std::fs;
use std::path::PathBuf;

/// The line before the table.
const BEGIN: &str = "<!-- settings table: generated from intercept_cli::config::SETTINGS by \
                     `cargo xtask config-docs`; edit the settings there, not here -->";

/// The line after the table.
const END: &str = "<!-- end of settings table -->";

/// The variable that turns the check into a rewrite.
const WRITE: &str = "INTERCEPT_WRITE_CONFIG_DOCS";

/// `text` (the page) with the table between the markers replaced by `table`.
fn render(text: &str, table: &str) -> Result<String, String> {
    let begin = text.find(BEGIN).ok_or(format!("no line `{BEGIN}`"))?;
    let table_start = begin + BEGIN.len();
    let end = text[table_start..]
        .find(END)
        .map(|i| table_start + i)
        .ok_or(format!("no line `{END}` after `{BEGIN}`"))?;
    Ok(format!("{}\n{table}{}", &text[..table_start], &text[end..]))
}

#[test]
fn the_settings_table_of_the_docs_is_rendered_from_the_settings() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let text = fs::read_to_string(&path).expect("docs/configuration.md");
    let rendered = render(&text, &intercept_cli::config::settings_table())
        .unwrap_or_else(|e| panic!("{e}: put the settings table between its marker lines"));
    if rendered == text {
        return;
    }
    if std::env::var_os(WRITE).is_some() {
        fs::write(&path, rendered).expect("writing docs/configuration.md");
        println!("config-docs: rewrote the settings table of docs/configuration.md");
        return;
    }
    panic!(
        "the settings table of docs/configuration.md differs from the settings of \
         `intercept serve`; run `cargo xtask config-docs`"
    );
}

#[test]
fn renders_between_the_markers_only() {
    let page = format!("# Title\n\nbefore\n\n{BEGIN}\n| old |\n{END}\n\nafter\n");
    let out = render(&page, "| key |\n").unwrap();
    assert_eq!(
        out,
        format!("# Title\n\nbefore\n\n{BEGIN}\n| key |\n{END}\n\nafter\n")
    );
    assert_eq!(
        render(&out, "| key |\n").unwrap(),
        out,
        "rendering is idempotent"
    );
    assert!(render("no markers", "").is_err());
}
