//! The command line (clap), kept apart from `main` so tests can parse it in-process.

use std::path::PathBuf;

use clap::{Arg, ArgMatches, Args, FromArgMatches, Parser, Subcommand};

use crate::config::{ConfigError, Layers, ServeConfig, CONFIG_ENV, SETTINGS};
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
    /// Read trace files: print their records, their stats, or export their episodes.
    #[command(subcommand)]
    Trace(TraceCommand),
}

/// `intercept trace ...`.
#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Print one full record per call (the record schema of docs/sidecar.md), one per
    /// line; files of trace_format = full are printed as they are.
    Cat {
        /// Trace files, or folders of them (each `*.jsonl` inside, sorted by name).
        #[arg(required = true, value_name = "PATH")]
        files: Vec<PathBuf>,
    },
    /// Print, per log, one JSON line: calls, nodes, branches, values, bytes, and bytes
    /// per byte of unique content (of the log, and of the same calls as full records).
    Stats {
        /// Trace files, or folders of them (each `*.jsonl` inside, sorted by name).
        #[arg(required = true, value_name = "PATH")]
        files: Vec<PathBuf>,
    },
    /// Write the logs' episodes as one table, one row per branch.
    Export {
        /// The table's format.
        #[arg(long, value_enum, default_value = "parquet")]
        format: ExportFormat,
        /// The file to write (replaced whole; written through a temporary file).
        #[arg(long, value_name = "PATH")]
        out: PathBuf,
        /// Trace files, or folders of them (each `*.jsonl` inside, sorted by name).
        #[arg(required = true, value_name = "PATH")]
        files: Vec<PathBuf>,
    },
}

/// Formats of `intercept trace export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Apache Parquet (pyarrow, Hugging Face `datasets`, pandas, polars read it).
    Parquet,
}

/// Flags of `intercept serve`: `--config` and one flag per setting of
/// [`SETTINGS`], each overriding the config file and
/// `INTERCEPT_*`.
///
/// The flags take text, checked by the same deserializer as the other layers, so errors
/// name the flag.
#[derive(Debug, Default, Clone)]
pub struct ServeArgs {
    /// TOML config file (also `INTERCEPT_CONFIG`).
    pub config: Option<PathBuf>,
    /// The settings given as flags: (setting key, value), in [`SETTINGS`] order.
    pub settings: Vec<(&'static str, String)>,
}

impl Args for ServeArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let config = Arg::new("config")
            .long("config")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .help("TOML config file (also `INTERCEPT_CONFIG`).");
        cmd.arg(config).args(SETTINGS.iter().map(|s| {
            Arg::new(s.key)
                .long(s.flag())
                .value_name(s.value)
                .help(format!("{} [default: {}]", s.summary(), s.default))
                .long_help(format!("{} [default: {}]", s.doc, s.default))
        }))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for ServeArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = ServeArgs::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        if let Some(path) = matches.get_one::<PathBuf>("config") {
            self.config = Some(path.clone());
        }
        for s in SETTINGS {
            if let Some(value) = matches.get_one::<String>(s.key) {
                self.settings.retain(|(k, _)| *k != s.key);
                self.settings.push((s.key, value.clone()));
            }
        }
        Ok(())
    }
}

impl ServeArgs {
    /// The flags that were given, as (setting key, value).
    pub fn flags(&self) -> Vec<(&'static str, String)> {
        self.settings.clone()
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
        ServeConfig::from_layers(Layers {
            file: path.as_deref().zip(text.as_deref()),
            env,
            flags: &self.settings,
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
        for key in crate::config::keys() {
            let flag = format!("--{}", key.replace('_', "-"));
            let cli = Cli::try_parse_from(["intercept", "serve", flag.as_str(), "v"]).unwrap();
            let Command::Serve(args) = cli.command else {
                panic!("not serve");
            };
            assert_eq!(args.flags(), vec![(key, "v".to_string())], "{flag}");
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
