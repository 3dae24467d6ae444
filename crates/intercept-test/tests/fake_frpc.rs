//! The `fake-frpc` binary as the prime tunnel tests find it. This integration test is also
//! why `cargo test --workspace` builds the binary, with the features of the rest of the
//! test build: [`intercept_test::prime::fake_frpc`] then finds it fresh in the target
//! directory and no test builds it with cargo while the suite runs.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fake-frpc");

#[test]
fn the_tests_find_the_binary_cargo_built() {
    let expected = std::env::var_os("INTERCEPT_FAKE_FRPC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(BIN));
    let found = intercept_test::prime::fake_frpc();
    assert_eq!(
        found.canonicalize().unwrap(),
        expected.canonicalize().unwrap()
    );
}

#[test]
fn it_answers_as_frpc_0_66_and_refuses_to_run_without_a_config() {
    let version = Command::new(BIN).arg("--version").output().unwrap();
    assert!(version.status.success(), "{version:?}");
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), "0.66.0");

    let bare = Command::new(BIN).output().unwrap();
    assert_eq!(bare.status.code(), Some(2), "{bare:?}");
    assert!(
        String::from_utf8_lossy(&bare.stderr).contains("usage: fake-frpc -c <config.toml>"),
        "{bare:?}"
    );

    let dir = std::env::temp_dir().join(format!("fake-frpc-missing-{}", std::process::id()));
    let missing = Command::new(BIN)
        .arg("-c")
        .arg(dir.join("frpc.toml"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&missing.stdout),
        String::from_utf8_lossy(&missing.stderr)
    );
    assert!(text.contains("read config"), "{text}");
}
