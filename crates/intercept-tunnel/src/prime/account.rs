//! Prime account configuration: API key, API base URL, team, from the environment and
//! `~/.prime/config.json` (as `prime_tunnel` 0.1.15 reads it).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::TunnelError;

/// The Prime API used when nothing else is configured.
pub const DEFAULT_API_BASE_URL: &str = "https://api.primeintellect.ai";

/// Where Prime configuration is read from: a home directory and a set of environment
/// variables. [`PrimeEnv::from_process`] uses the real ones; tests inject their own.
#[derive(Clone, Default)]
pub struct PrimeEnv {
    /// The home directory (`~/.prime` lives in it).
    pub home: PathBuf,
    /// Environment variables.
    pub vars: BTreeMap<String, String>,
}

impl fmt::Debug for PrimeEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Variables may hold the API key: print only their names.
        f.debug_struct("PrimeEnv")
            .field("home", &self.home)
            .field("vars", &self.vars.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl PrimeEnv {
    /// The process's `$HOME` (temp dir without one) and its `PRIME_*` / `FRPC_PATH`
    /// variables.
    pub fn from_process() -> Self {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let vars = std::env::vars()
            .filter(|(k, _)| k.starts_with("PRIME_") || k == "FRPC_PATH")
            .collect();
        PrimeEnv { home, vars }
    }

    /// An environment with `home` and no variables.
    pub fn with_home(home: impl Into<PathBuf>) -> Self {
        PrimeEnv {
            home: home.into(),
            vars: BTreeMap::new(),
        }
    }

    /// Sets a variable.
    pub fn var(mut self, key: &str, value: &str) -> Self {
        self.vars.insert(key.into(), value.into());
        self
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }

    /// `~/.prime`.
    pub fn prime_dir(&self) -> PathBuf {
        self.home.join(".prime")
    }
}

/// A resolved Prime account.
#[derive(Clone)]
pub struct PrimeAccount {
    /// The API key (never logged).
    pub(crate) api_key: String,
    /// The API base URL, without a trailing `/` or `/api/v1`.
    pub base_url: String,
    /// The team to create tunnels for, if any.
    pub team_id: Option<String>,
    /// The user id, if configured.
    pub user_id: Option<String>,
}

impl fmt::Debug for PrimeAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimeAccount")
            .field(
                "api_key",
                &if self.api_key.is_empty() {
                    "<none>"
                } else {
                    "<set>"
                },
            )
            .field("base_url", &self.base_url)
            .field("team_id", &self.team_id)
            .field("user_id", &self.user_id)
            .finish()
    }
}

impl PrimeAccount {
    /// Resolves the account from `env` (as `prime_tunnel` 0.1.15 does). Fails when no API
    /// key is configured, or when `PRIME_CONTEXT` names a missing or invalid environment
    /// file.
    pub fn resolve(env: &PrimeEnv) -> Result<Self, TunnelError> {
        let mut file = read_object(&env.prime_dir().join("config.json"));
        if let Some(context) = env.get("PRIME_CONTEXT").filter(|c| !c.is_empty()) {
            if context.eq_ignore_ascii_case("production") {
                file.remove("base_url");
                file.remove("team_id");
                file.remove("team_name");
                file.remove("team_role");
            } else {
                let valid = context
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    return Err(TunnelError::Config(format!(
                        "PRIME_CONTEXT {context:?} is not a valid context name \
                         (letters, digits, `_` and `-` only)"
                    )));
                }
                let path = env
                    .prime_dir()
                    .join("environments")
                    .join(format!("{context}.json"));
                let overlay = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .and_then(|v| match v {
                        Value::Object(m) => Some(m),
                        _ => None,
                    })
                    .ok_or_else(|| {
                        TunnelError::Config(format!(
                            "PRIME_CONTEXT={context}: {} is missing or not a JSON object; \
                             create it with `prime config` or unset PRIME_CONTEXT",
                            path.display()
                        ))
                    })?;
                file.extend(overlay);
            }
        }
        let from_file = |key: &str| {
            file.get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let api_key = env
            .get("PRIME_API_KEY")
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .or_else(|| from_file("api_key"))
            .unwrap_or_default();
        if api_key.is_empty() {
            return Err(TunnelError::Config(
                "not authenticated with prime: run `prime login` or set $PRIME_API_KEY".into(),
            ));
        }
        let team_id = match env.get("PRIME_TEAM_ID") {
            Some(t) => Some(t.to_string()).filter(|t| !t.is_empty()),
            None => from_file("team_id"),
        };
        let user_id = match env.get("PRIME_USER_ID") {
            Some(t) => Some(t.to_string()).filter(|t| !t.is_empty()),
            None => from_file("user_id"),
        };
        let base = env
            .get("PRIME_API_BASE_URL")
            .filter(|s| !s.is_empty())
            .or_else(|| env.get("PRIME_BASE_URL").filter(|s| !s.is_empty()))
            .map(str::to_string)
            .or_else(|| from_file("base_url"))
            .unwrap_or_else(|| DEFAULT_API_BASE_URL.to_string());
        Ok(PrimeAccount {
            api_key,
            base_url: normalise_base(&base),
            team_id,
            user_id,
        })
    }

    /// A short, non-reversible tag of the API key, to key per-account state (the rate
    /// limiter's window file) without writing the key anywhere.
    pub fn key_tag(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.api_key.as_bytes());
        digest[..6].iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn normalise_base(base: &str) -> String {
    let mut b = base.trim().trim_end_matches('/');
    if let Some(stripped) = b.strip_suffix("/api/v1") {
        b = stripped;
    }
    b.trim_end_matches('/').to_string()
}

/// A JSON object from `path`; anything else (missing, unreadable, not an object) is empty.
fn read_object(path: &Path) -> Map<String, Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home_with(config: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".prime/environments")).unwrap();
        std::fs::write(dir.path().join(".prime/config.json"), config).unwrap();
        dir
    }

    #[test]
    fn env_wins_over_the_file() {
        let home = home_with(
            r#"{"api_key":"file-key","team_id":"file-team","base_url":"https://file.example/api/v1/"}"#,
        );
        let env = PrimeEnv::with_home(home.path());
        let a = PrimeAccount::resolve(&env).unwrap();
        assert_eq!(a.api_key, "file-key");
        assert_eq!(a.team_id.as_deref(), Some("file-team"));
        assert_eq!(a.base_url, "https://file.example");

        let env = env
            .var("PRIME_API_KEY", "env-key")
            .var("PRIME_TEAM_ID", "")
            .var("PRIME_BASE_URL", "http://b.example/")
            .var("PRIME_API_BASE_URL", "http://a.example/api/v1");
        let a = PrimeAccount::resolve(&env).unwrap();
        assert_eq!(a.api_key, "env-key");
        assert_eq!(a.team_id, None, "an empty PRIME_TEAM_ID overrides the file");
        assert_eq!(a.base_url, "http://a.example");
        assert!(!format!("{a:?}").contains("env-key"));
        assert!(!format!("{env:?}").contains("env-key"));
    }

    #[test]
    fn missing_key_says_what_to_do() {
        let home = home_with("[1, 2]");
        let err = PrimeAccount::resolve(&PrimeEnv::with_home(home.path())).unwrap_err();
        assert!(err.to_string().contains("prime login"), "{err}");
        assert!(err.to_string().contains("PRIME_API_KEY"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let a = PrimeAccount::resolve(&PrimeEnv::with_home(empty.path()).var("PRIME_API_KEY", "k"))
            .unwrap();
        assert_eq!(a.base_url, DEFAULT_API_BASE_URL);
    }

    #[test]
    fn contexts() {
        let home = home_with(r#"{"api_key":"k","team_id":"t","base_url":"http://file.example"}"#);
        std::fs::write(
            home.path().join(".prime/environments/staging.json"),
            r#"{"base_url":"http://staging.example","team_id":"st"}"#,
        )
        .unwrap();
        let env = PrimeEnv::with_home(home.path());
        let a = PrimeAccount::resolve(&env.clone().var("PRIME_CONTEXT", "staging")).unwrap();
        assert_eq!(
            (a.base_url.as_str(), a.team_id.as_deref()),
            ("http://staging.example", Some("st"))
        );
        let a = PrimeAccount::resolve(&env.clone().var("PRIME_CONTEXT", "PRODUCTION")).unwrap();
        assert_eq!(
            (a.base_url.as_str(), a.team_id),
            (DEFAULT_API_BASE_URL, None)
        );
        let err = PrimeAccount::resolve(&env.clone().var("PRIME_CONTEXT", "../etc")).unwrap_err();
        assert!(err.to_string().contains("not a valid context"), "{err}");
        let err = PrimeAccount::resolve(&env.var("PRIME_CONTEXT", "nope")).unwrap_err();
        assert!(err.to_string().contains("nope.json"), "{err}");
    }

    #[test]
    fn key_tag_is_stable_and_hides_the_key() {
        let a = PrimeAccount {
            api_key: "secret-key".into(),
            base_url: String::new(),
            team_id: None,
            user_id: None,
        };
        assert_eq!(a.key_tag().len(), 12);
        assert_eq!(a.key_tag(), a.clone().key_tag());
        assert!(!a.key_tag().contains("secret"));
    }
}
