//! The command line (clap), kept apart from `main` so tests can parse it in-process.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{ConfigError, Layers, ServeConfig, CONFIG_ENV};
use crate::demo::DemoOptions;

/// `intercept`: intercept the LLM API calls of RL rollouts' agent programs.
#[derive(Debug, Parser)]
#[command(name = "intercept", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an interception as a sidecar with a loopback control API.
    Serve(Box<ServeArgs>),
    /// Run simulated rollouts against an embedded mock model and print a summary.
    Demo(DemoArgs),
}

/// Flags of `intercept serve`. Each overrides the config file and `INTERCEPT_*`.
///
/// Values are checked by the same parser as the other layers, so errors name the flag.
#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// TOML config file (also `INTERCEPT_CONFIG`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Default upstream: an OpenAI-compatible base URL with its version segment
    /// (`http://127.0.0.1:8000/v1`), or `mock` for the embedded mock model.
    #[arg(long, value_name = "URL|mock")]
    pub upstream: Option<String>,
    /// Name of the environment variable holding the upstream API key.
    #[arg(long, value_name = "VAR")]
    pub upstream_api_key_env: Option<String>,
    /// Environment variables sessions may name as `upstream.api_key_env`, comma-separated
    /// [default: the --upstream-api-key-env variable].
    #[arg(long, value_name = "VAR,...")]
    pub allowed_key_envs: Option<String>,
    /// Default model imposed on sessions that name none.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Control API address (loopback only) [default: 127.0.0.1:0].
    #[arg(long, value_name = "ADDR")]
    pub control: Option<String>,
    /// Control API token (else `INTERCEPT_CONTROL_TOKEN`, else generated).
    #[arg(long, value_name = "TOKEN")]
    pub control_token: Option<String>,
    /// Interception shape [default: server].
    #[arg(long, value_name = "server|static|elastic")]
    pub interception: Option<String>,
    /// Sessions per server in an elastic pool [default: 32].
    #[arg(long, value_name = "N")]
    pub multiplex: Option<String>,
    /// Servers an elastic pool keeps up [default: 1 with a tunnel, else 0].
    #[arg(long, value_name = "N")]
    pub min_servers: Option<String>,
    /// Cap on an elastic pool's servers [default: 256].
    #[arg(long, value_name = "N")]
    pub max_servers: Option<String>,
    /// Identical servers of a static pool [default: 1].
    #[arg(long, value_name = "N")]
    pub static_servers: Option<String>,
    /// Tunnel exposing every server [default: none].
    #[arg(long, value_name = "none|custom|prime|bore")]
    pub tunnel: Option<String>,
    /// Custom tunnel: the public URL that reaches the server.
    #[arg(long, value_name = "URL")]
    pub tunnel_url: Option<String>,
    /// Custom tunnel: the local port the URL forwards to.
    #[arg(long, value_name = "PORT")]
    pub tunnel_port: Option<String>,
    /// Custom tunnel: the address the server binds [default: 0.0.0.0].
    #[arg(long, value_name = "IP")]
    pub tunnel_host: Option<String>,
    /// Bore tunnel: the host running `bore server`.
    #[arg(long, value_name = "HOST")]
    pub bore_server: Option<String>,
    /// Bore tunnel: its control port [default: 7835].
    #[arg(long, value_name = "PORT")]
    pub bore_port: Option<String>,
    /// Bore tunnel: name of the environment variable holding the server's secret.
    #[arg(long, value_name = "VAR")]
    pub bore_secret_env: Option<String>,
    /// Append each call record to `<DIR>/<session id>.jsonl` as the call ends.
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<String>,
    /// Log filter, `RUST_LOG` syntax [default: $RUST_LOG, else info].
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Log format on stderr: text or json [default: text].
    #[arg(long, value_name = "text|json")]
    pub log_format: Option<String>,
    /// Prime: the SHA-256 of the frp release tarball for this platform, so frpc may be
    /// downloaded when it is not installed [default: none].
    #[arg(long, value_name = "HEX")]
    pub frpc_sha256: Option<String>,
    /// Prime and bore: where the tunnel start rate limiter keeps its window: file (this
    /// host) or redis (a fleet of hosts sharing --rate-limit-url) [default: file].
    #[arg(long, value_name = "file|redis")]
    pub rate_limit_backend: Option<String>,
    /// The Redis server of --rate-limit-backend redis (redis://host:port/db).
    #[arg(long, value_name = "URL")]
    pub rate_limit_url: Option<String>,
    /// Elastic: seconds session creation waits for a seat before failing with 503
    /// [default: 300].
    #[arg(long, value_name = "SECS")]
    pub wait_timeout_secs: Option<String>,
    /// Elastic: seconds an unhealthy server's sessions may finish before it is torn down
    /// [default: 120].
    #[arg(long, value_name = "SECS")]
    pub drain_timeout_secs: Option<String>,
    /// Elastic: seconds a server may stay empty (beyond min_servers) before it is
    /// stopped [default: 300].
    #[arg(long, value_name = "SECS")]
    pub server_idle_timeout_secs: Option<String>,
    /// Seconds in-flight calls may take to finish on shutdown [default: 30].
    #[arg(long, value_name = "SECS")]
    pub shutdown_grace_secs: Option<String>,
    /// Seconds a client has to send a whole request head, counted from the
    /// connection's start or its previous answer; 0: no limit [default: 30].
    #[arg(long, value_name = "SECS")]
    pub header_read_timeout_secs: Option<String>,
    /// Released sessions whose traces stay readable [default: 4096].
    #[arg(long, value_name = "N")]
    pub released_retention: Option<String>,
    /// Bytes of released traces held in memory without --trace-dir; the oldest are
    /// dropped first [default: 268435456].
    #[arg(long, value_name = "BYTES")]
    pub released_trace_bytes: Option<String>,
    /// Largest upstream answer read for one call, in bytes; past it the call fails with
    /// 502 [default: 268435456].
    #[arg(long, value_name = "BYTES")]
    pub max_response_bytes: Option<String>,
    /// Connections served at once per harness port and by the control API; one beyond
    /// is answered 503 with Retry-After: 1; 0: no cap [default: 16384].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<String>,
    /// Seconds a plain-HTTP upstream may take no byte of a request before the call
    /// fails; 0 turns it off [default: 30].
    #[arg(long, value_name = "SECS")]
    pub upstream_write_idle_secs: Option<String>,
    /// Seconds a plain-HTTP upstream may send nothing, once it has the request, before
    /// the call fails; 0 turns it off [default: 0, off].
    #[arg(long, value_name = "SECS")]
    pub upstream_read_idle_secs: Option<String>,
    /// Default network policy: hosts the model provider may reach for a session,
    /// comma-separated `*`, `*.domain` or host patterns [default: *].
    #[arg(long, value_name = "PATTERNS")]
    pub network_allow: Option<String>,
    /// Default network policy: hosts never allowed, comma-separated patterns [default: none].
    #[arg(long, value_name = "PATTERNS")]
    pub network_block: Option<String>,
    /// Default network policy: strip or reject a forbidden capability [default: strip].
    #[arg(long, value_name = "strip|reject")]
    pub network_on_violation: Option<String>,
}

impl ServeArgs {
    /// The flags that were given, as (setting key, value).
    pub fn flags(&self) -> Vec<(&'static str, String)> {
        [
            ("upstream", &self.upstream),
            ("upstream_api_key_env", &self.upstream_api_key_env),
            ("allowed_key_envs", &self.allowed_key_envs),
            ("model", &self.model),
            ("control", &self.control),
            ("control_token", &self.control_token),
            ("interception", &self.interception),
            ("multiplex", &self.multiplex),
            ("min_servers", &self.min_servers),
            ("max_servers", &self.max_servers),
            ("static_servers", &self.static_servers),
            ("tunnel", &self.tunnel),
            ("tunnel_url", &self.tunnel_url),
            ("tunnel_port", &self.tunnel_port),
            ("tunnel_host", &self.tunnel_host),
            ("bore_server", &self.bore_server),
            ("bore_port", &self.bore_port),
            ("bore_secret_env", &self.bore_secret_env),
            ("frpc_sha256", &self.frpc_sha256),
            ("rate_limit_backend", &self.rate_limit_backend),
            ("rate_limit_url", &self.rate_limit_url),
            ("wait_timeout_secs", &self.wait_timeout_secs),
            ("drain_timeout_secs", &self.drain_timeout_secs),
            ("server_idle_timeout_secs", &self.server_idle_timeout_secs),
            ("trace_dir", &self.trace_dir),
            ("log", &self.log),
            ("log_format", &self.log_format),
            ("shutdown_grace_secs", &self.shutdown_grace_secs),
            ("header_read_timeout_secs", &self.header_read_timeout_secs),
            ("released_retention", &self.released_retention),
            ("released_trace_bytes", &self.released_trace_bytes),
            ("max_response_bytes", &self.max_response_bytes),
            ("max_connections", &self.max_connections),
            ("upstream_write_idle_secs", &self.upstream_write_idle_secs),
            ("upstream_read_idle_secs", &self.upstream_read_idle_secs),
            ("network_allow", &self.network_allow),
            ("network_block", &self.network_block),
            ("network_on_violation", &self.network_on_violation),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }

    /// Resolves the settings: the config file (`--config`, else `INTERCEPT_CONFIG`) <
    /// `env` < these flags.
    pub fn resolve(&self, env: &[(String, String)]) -> Result<ServeConfig, ConfigError> {
        let path = self.config.clone().or_else(|| {
            env.iter()
                .find(|(k, _)| k == CONFIG_ENV)
                .map(|(_, v)| PathBuf::from(v))
        });
        let text = match &path {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|e| ConfigError::File {
                path: p.clone(),
                message: e.to_string(),
            })?),
            None => None,
        };
        let flags = self.flags();
        ServeConfig::from_layers(Layers {
            file: path.as_deref().zip(text.as_deref()),
            env,
            flags: &flags,
        })
    }
}

/// Flags of `intercept demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Concurrent simulated rollouts.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rollouts: u32,
    /// User turns per rollout [default: 3 to 5, varying].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub turns: Option<u32>,
    /// Where to write the JSONL traces [default: a fresh directory under the temp dir].
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
}

impl DemoArgs {
    /// The demo options.
    pub fn options(&self) -> DemoOptions {
        DemoOptions {
            rollouts: self.rollouts as usize,
            turns: self.turns.map(|t| t as usize),
            trace_dir: self.trace_dir.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_layers_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("intercept.toml");
        std::fs::write(
            &file,
            "upstream = \"mock\"\nmultiplex = 4\nmodel = \"file\"\n",
        )
        .unwrap();
        let cli = Cli::try_parse_from([
            "intercept",
            "serve",
            "--model",
            "flag",
            "--trace-dir",
            "/tmp/t",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        let env = vec![
            (CONFIG_ENV.to_string(), file.display().to_string()),
            ("INTERCEPT_MULTIPLEX".to_string(), "6".to_string()),
        ];
        let c = args.resolve(&env).unwrap();
        assert_eq!(c.model.as_deref(), Some("flag"));
        assert_eq!(c.multiplex, 6);
        assert_eq!(c.upstream, Some(crate::config::UpstreamSetting::Mock));
        assert_eq!(c.trace_dir, Some(PathBuf::from("/tmp/t")));

        let missing = ServeArgs {
            config: Some(dir.path().join("absent.toml")),
            ..ServeArgs::default()
        };
        assert!(matches!(
            missing.resolve(&[]),
            Err(ConfigError::File { .. })
        ));
    }

    #[test]
    fn every_setting_has_a_flag() {
        for key in crate::config::KEYS {
            let flag = format!("--{}", key.replace('_', "-"));
            let cli = Cli::try_parse_from(["intercept", "serve", flag.as_str(), "v"]).unwrap();
            let Command::Serve(args) = cli.command else {
                panic!("not serve");
            };
            assert_eq!(args.flags(), vec![(*key, "v".to_string())], "{flag}");
        }
    }

    #[test]
    fn demo_flags() {
        let cli =
            Cli::try_parse_from(["intercept", "demo", "--rollouts", "3", "--turns", "2"]).unwrap();
        let Command::Demo(args) = cli.command else {
            panic!("not demo");
        };
        let o = args.options();
        assert_eq!((o.rollouts, o.turns), (3, Some(2)));
        assert!(Cli::try_parse_from(["intercept", "demo", "--rollouts", "0"]).is_err());
    }
}
