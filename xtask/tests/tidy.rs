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

#[test]
fn docs_are_timeless() {
    assert_holds(
        "timeless-docs",
        tidy::timeless_docs(&xtask::workspace_root()),
    );
}
