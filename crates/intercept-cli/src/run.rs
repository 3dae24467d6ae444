//! The `intercept` command as a function: [`run`] parses a command line and runs it,
//! exactly what the binary does. The binary and the Python package's `intercept`
//! entry point both call it.

use std::ffi::OsString;

use anyhow::Context as _;
use clap::Parser as _;

use crate::cli::{Cli, Command};
use crate::config::{LogFormat, ServeConfig};

/// Runs the `intercept` command line `args` (the program name first) to its end and
/// returns the process exit status: 0 on success, 1 when the demo saw failed calls, 2
/// for a bad command line or setting (the message goes to stderr; `--help` and
/// `--version` print to stdout and return 0).
///
/// `serve` returns on SIGINT or SIGTERM after its graceful shutdown; it first raises the
/// process's soft open-file limit to the hard one. The other process-wide choices
/// (allocator, transparent huge pages) are left to the caller.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return u8::try_from(code).unwrap_or(2);
        }
    };
    let result = match cli.command {
        Command::Serve(args) => {
            let env: Vec<(String, String)> = std::env::vars().collect();
            match args.resolve(&env) {
                Ok(config) => serve(config),
                Err(e) => Err(anyhow::Error::new(e)),
            }
        }
        Command::Demo(args) => demo(args.options()),
        Command::Trace(command) => trace(command),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("intercept: {e:#}");
            2
        }
    }
}

/// `intercept trace ...`. A reader that stops reading (`intercept trace cat DIR | head`)
/// ends the command quietly, as it ends any filter of a pipeline.
fn trace(command: crate::cli::TraceCommand) -> anyhow::Result<u8> {
    match trace_to_stdout(command) {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(0)
        }
        other => other,
    }
}

fn trace_to_stdout(command: crate::cli::TraceCommand) -> anyhow::Result<u8> {
    use crate::cli::TraceCommand;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    match command {
        TraceCommand::Cat { files } => crate::trace::cat(&files, &mut out, &mut err)?,
        TraceCommand::Stats { files } => crate::trace::stats(&files, &mut out, &mut err)?,
        TraceCommand::Export {
            format: _,
            out: path,
            files,
        } => {
            let rows = crate::trace::export(&files, &path, &mut err)?;
            std::io::Write::flush(&mut out)?;
            eprintln!("wrote {rows} branches to {}", path.display());
        }
    }
    Ok(0)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Installs the stderr log subscriber, unless the process already has one (the Python
/// package may have installed its own).
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
        .with_writer(move || crate::logs::Escaping::new(std::io::stderr(), ansi));
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn serve(config: ServeConfig) -> anyhow::Result<u8> {
    init_logs(config.log.as_deref(), config.log_format);
    raise_open_file_limit();
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    runtime()?.block_on(async move {
        // Registered before the sidecar starts (and prints its ready line), so a signal
        // sent right after the ready line is never missed.
        let shutdown = shutdown_signal();
        crate::sidecar::serve(config, shutdown).await
    })?;
    Ok(0)
}

/// The most open files the soft limit is raised to when the hard limit is unlimited
/// (Linux's default `fs.nr_open`).
const OPEN_FILES_CEILING: u64 = 1 << 20;

/// Raises the soft open-file limit (`RLIMIT_NOFILE`) to the hard one. A sidecar holds a
/// descriptor per harness connection, upstream connection and trace file, and the
/// common default soft limit of 1024 runs out at a few hundred rollouts while the hard
/// limit (often 512 Ki or more) allows far more. Failing to raise it is not an error:
/// the limit stays as it was, and a server at its limit answers 503 rather than 500.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let Some(soft) = limit.current else {
        return; // Already unlimited.
    };
    let target = limit.maximum.unwrap_or(OPEN_FILES_CEILING);
    if target <= soft {
        tracing::debug!(soft, "open-file limit already at its hard limit");
        return;
    }
    let raised = Rlimit {
        current: Some(target),
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::info!(from = soft, to = target, "raised the open-file limit"),
        Err(e) => tracing::warn!(
            soft,
            hard = target,
            error = %e,
            "cannot raise the open-file limit; it stays at {soft}"
        ),
    }
}

/// Resolves on SIGINT or SIGTERM; the handlers are installed when this is called (inside
/// the runtime), not when it is first polled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        match signals {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received");
    }
}

fn demo(options: crate::DemoOptions) -> anyhow::Result<u8> {
    init_logs(Some("warn"), LogFormat::Text);
    let summary = runtime()?.block_on(crate::demo::run(options))?;
    println!("{summary}");
    Ok(if summary.ok() { 0 } else { 1 })
}
