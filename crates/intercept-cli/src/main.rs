//! The `intercept` binary: parse the command line, build a config value, call the library.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use intercept_cli::cli::{Cli, Command};
use intercept_cli::config::{LogFormat, ServeConfig};

/// mimalloc: a streamed call allocates ~150 times (events, frames, the record); glibc's
/// allocator spent ~13 % of the proxy's instructions on them, mimalloc about a third of
/// that (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Transparent huge pages off for this process. With them, memory that grows (traces
/// kept in memory) is faulted in 2 MiB at a time, each fault zeroing 2 MiB in the middle
/// of a call: recording into in-memory traces ran at p99 5.6 ms instead of 0.9 ms, with a
/// quarter more CPU per call (docs/benchmarks.md). mimalloc is built not to ask for them
/// (`no_thp`); this also covers hosts whose kernel gives them unasked (`enabled =
/// always`). A host that refuses the request keeps its default.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => {
            let env: Vec<(String, String)> = std::env::vars().collect();
            match args.resolve(&env) {
                Ok(config) => serve(config),
                Err(e) => Err(anyhow::Error::new(e)),
            }
        }
        Command::Demo(args) => demo(args.options()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("intercept: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn init_logs(filter: Option<&str>, format: LogFormat) {
    let filter = match filter {
        Some(f) => tracing_subscriber::EnvFilter::new(f),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // Every line escaped: no text an event carries can forge another line.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(move || intercept_cli::logs::Escaping::new(std::io::stderr(), ansi));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn serve(config: ServeConfig) -> anyhow::Result<ExitCode> {
    init_logs(config.log.as_deref(), config.log_format);
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    runtime()?.block_on(intercept_cli::sidecar::serve(config, shutdown_signal()))?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    tracing::info!("shutdown signal received");
}

fn demo(options: intercept_cli::DemoOptions) -> anyhow::Result<ExitCode> {
    init_logs(Some("warn"), LogFormat::Text);
    let summary = runtime()?.block_on(intercept_cli::demo::run(options))?;
    println!("{summary}");
    Ok(if summary.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
