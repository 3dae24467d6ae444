//! The tidy rules as plain tests, so `cargo test --workspace` enforces them as well as
//! `cargo xtask tidy`. One test per rule, so a failure names the rule.

use xtask::tidy::{self, Violation};

fn assert_holds(rule: &str, found: anyhow::Result<Vec<Violation>>) {
    let violations = match found {
        Ok(v) => v,
        Err(e) => panic!("tidy rule {rule} could not run: {e:#}"),
    };
    assert!(violations.is_empty(), "{}", tidy::report(&violations));
}

#[test]
fn core_stays_free_of_http_io_and_siblings() {
    assert_holds(
        "core-isolated",
        tidy::core_isolated(&xtask::workspace_root()),
    );
}

#[test]
fn dependencies_point_one_way() {
    assert_holds(
        "one-way-deps / fakes-stay-in-tests",
        tidy::one_way_deps(&xtask::workspace_root()),
    );
}

#[test]
fn manifests_use_workspace_lints_and_crates_have_docs() {
    assert_holds(
        "server-names-no-tunnel / workspace-lints / crate-docs",
        tidy::manifest_rules(&xtask::workspace_root()),
    );
}

#[test]
fn every_workspace_dependency_is_used() {
    assert_holds(
        "workspace-deps-used",
        tidy::workspace_deps_used(&xtask::workspace_root()),
    );
}

#[test]
fn sources_have_no_placeholders() {
    assert_holds(
        "no-placeholders",
        tidy::no_placeholders(&xtask::workspace_root()),
    );
}

#[test]
fn every_library_file_is_in_the_code_map() {
    assert_holds("code-map", tidy::code_map(&xtask::workspace_root()));
}

#[test]
fn modules_use_each_other_one_way() {
    assert_holds(
        "module-cycles",
        tidy::module_cycles(&xtask::workspace_root()),
    );
}

/// The rule reads the real crates: every library crate is checked, and edges the code
/// is known to have are seen (a reader that found no path at all would pass vacuously).
#[test]
fn module_cycles_reads_every_library_crate_and_its_edges() {
    let root = xtask::workspace_root();
    let crates = tidy::library_crates(&root).expect("list the crates");
    for name in [
        "intercept-cli",
        "intercept-core",
        "intercept-mock",
        "intercept-server",
        "intercept-tokens",
    ] {
        assert!(crates.iter().any(|c| c == name), "{name} not in {crates:?}");
    }
    let has_edge = |krate: &str, parent: &[&str], from: &str, to: &str| {
        let parent: Vec<String> = parent.iter().map(|s| (*s).to_owned()).collect();
        let tree = tidy::crate_modules(&root, krate).expect("read the crate");
        let edges = tree.sibling_edges();
        edges
            .get(&parent)
            .and_then(|e| e.get(from))
            .is_some_and(|targets| targets.contains(to))
    };
    // `use crate::trace::record::Usage;` and `crate::body::from_json_bytes(..)`.
    assert!(has_edge("intercept-core", &[], "dialect", "trace"));
    assert!(has_edge("intercept-core", &[], "dialect", "body"));
    // `crate::ErrorKind`, through the root's `pub use error::{.., ErrorKind}`.
    assert!(has_edge("intercept-core", &[], "trace", "error"));
    // Submodules: the record's readers under `trace/`.
    assert!(has_edge("intercept-core", &["trace"], "episode", "record"));
    assert!(has_edge("intercept-tokens", &[], "qwen3", "render"));
    assert!(has_edge("intercept-tokens", &[], "factory", "qwen3"));
    // `use super::chat::write_json;` in a top-level file.
    assert!(has_edge("intercept-mock", &[], "vllm", "chat"));
}

/// On a crate with a cycle the rule fails, naming it; on an empty `crates/` it errs.
#[test]
fn module_cycles_fails_on_a_crate_with_a_cycle() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create");
        std::fs::write(path, text).expect("write");
    };
    std::fs::create_dir_all(dir.path().join("crates")).expect("create");
    assert!(tidy::module_cycles(dir.path()).is_err());
    write(
        "crates/lib-a/src/lib.rs",
        "//! A.\nmod body;\nmod error;\nmod trace;\npub use trace::record;\n",
    );
    write("crates/lib-a/src/body.rs", "use crate::error::Error;\n");
    write(
        "crates/lib-a/src/error.rs",
        "pub enum Error {\n    Record(crate::record::Usage),\n}\n",
    );
    write("crates/lib-a/src/trace/mod.rs", "pub mod record;\n");
    write(
        "crates/lib-a/src/trace/record.rs",
        "use super::super::{\n    body::JsonBody,\n};\n",
    );
    write("crates/lib-b/src/lib.rs", "//! B.\nmod a;\nmod b;\n");
    write(
        "crates/lib-b/src/a.rs",
        "use super::b::X;\n#[cfg(test)]\nmod tests { use crate::a; }\n",
    );
    write(
        "crates/lib-b/src/b.rs",
        "// use crate::a;\nconst S: &str = \"crate::a::Y\";\n",
    );
    let found = tidy::module_cycles(dir.path()).expect("the rule runs");
    assert_eq!(found.len(), 1, "{}", tidy::report(&found));
    assert_eq!(found[0].rule, "module-cycles");
    assert_eq!(found[0].location, "crates/lib-a");
    assert!(
        found[0].detail.contains("(body → error → trace → body)"),
        "{}",
        found[0]
    );
}

#[test]
fn docs_are_timeless() {
    assert_holds(
        "timeless-docs",
        tidy::timeless_docs(&xtask::workspace_root()),
    );
}
