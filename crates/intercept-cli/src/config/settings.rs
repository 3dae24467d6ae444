//! [`SETTINGS`]: the documentation of every setting of `intercept serve`, one row per key
//! in the order of [`ServeConfig`](super::ServeConfig)'s fields. It gives the flags of `intercept serve` and the
//! table of `docs/configuration.md` ([`settings_table`]).

use super::Source;

/// The documentation of one setting of `intercept serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The key as written in the config file; the environment variable is `INTERCEPT_` +
    /// the key in upper case, the flag `--` + the key with `-` for `_`.
    pub key: &'static str,
    /// What the flag takes, as its help shows it (`N`, `SECS`, `none|custom|prime|bore`).
    pub value: &'static str,
    /// The default (Markdown).
    pub default: &'static str,
    /// What it does (Markdown).
    pub doc: &'static str,
}

impl Setting {
    /// The setting's environment variable (`INTERCEPT_MULTIPLEX`).
    pub fn env(&self) -> String {
        Source::Env.spell(self.key)
    }

    /// The first sentence of [`Setting::doc`] (up to a `. ` before a capital letter).
    pub fn summary(&self) -> &'static str {
        let ends = self.doc.match_indices(". ").find(|(i, _)| {
            self.doc[i + 2..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase())
        });
        ends.map_or(self.doc, |(i, _)| &self.doc[..=i])
    }

    /// The setting's flag without its dashes (`max-servers`).
    pub fn flag(&self) -> String {
        self.key.replace('_', "-")
    }
}

/// Every setting of `intercept serve`, in the order of
/// [`ServeConfig`](super::ServeConfig)'s fields and of the table in `docs/configuration.md`.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "upstream",
        value: "URL|mock",
        default: "none",
        doc: "Default upstream of sessions that name none: an OpenAI-compatible base URL \
            with its version segment (`http://127.0.0.1:8000/v1`), or `mock` for the \
            embedded mock model. Without it every `POST /v1/sessions` must carry \
            `upstream`.",
    },
    Setting {
        key: "upstream_api_key_env",
        value: "VAR",
        default: "none",
        doc: "*Name* of the environment variable holding the default upstream's API key (the \
            key is never taken from the command line). Start fails if the variable is \
            unset.",
    },
    Setting {
        key: "allowed_key_envs",
        value: "VAR,...",
        default: "the `upstream_api_key_env` variable (none without it)",
        doc: "Comma-separated names of the environment variables a session may name as \
            `upstream.api_key_env` in `POST /v1/sessions`; any other is refused with 400.",
    },
    Setting {
        key: "model",
        value: "NAME",
        default: "none (`mock-model` with `upstream = \"mock\"`)",
        doc: "Default model of sessions that name none. Without it every session must carry \
            `model`.",
    },
    Setting {
        key: "tokens",
        value: "JSON",
        default: "none (off)",
        doc: "Default token-in/token-out of sessions (see [tokens.md](tokens.md)): in the \
            file a `[tokens]` table, in the environment and on the command line its JSON \
            (`{\"renderer\": \"qwen3\", \"tokenizer\": \"/models/qwen3\"}`), with the \
            keys `renderer` and `tokenizer` (required), `engine` (`vllm` or `sglang`, \
            default `vllm`), `on_mismatch` (`render`, `chat` or `fail`, default `render`) \
            and `enable_thinking`. A session's `tokens` object is merged over these keys; \
            its `null` or `false` turns the default off. `off` (or JSON `null`, `false`): \
            none.",
    },
    Setting {
        key: "control",
        value: "ADDR",
        default: "`127.0.0.1:0`",
        doc: "Control API address. Loopback only (`127.0.0.1`, `[::1]`); port 0 picks a free \
            port, reported on the ready line.",
    },
    Setting {
        key: "control_token",
        value: "TOKEN",
        default: "generated (128 random bits)",
        doc: "Bearer token of the control API. Also `INTERCEPT_CONTROL_TOKEN`. Printed once, \
            on the ready line; never logged.",
    },
    Setting {
        key: "interception",
        value: "server|static|elastic",
        default: "`server`",
        doc: "Interception shape: `server` (one interception server), `static` \
            (`static_servers` identical servers, all started up front, least-loaded first) \
            or `elastic` (servers of `multiplex` sessions each, started on demand, healed \
            when their tunnel dies, shrunk when idle; see [pools.md](pools.md)). The \
            sidecar defaults to `server` (unlike the library's `InterceptionConfig`, which \
            defaults to `elastic`): without a tunnel one server multiplexes any number of \
            sessions and there is nothing to scale. With a tunnel, choose `elastic`.",
    },
    Setting {
        key: "multiplex",
        value: "N",
        default: "32",
        doc: "Sessions per server (and so per tunnel) of an elastic pool; at least 1. \
            Validated but unused by `server` and `static`.",
    },
    Setting {
        key: "min_servers",
        value: "N",
        default: "1 with a tunnel, else 0",
        doc: "Elastic: servers warmed at start, regrown after a retirement, never shrunk \
            below. At most `max_servers`.",
    },
    Setting {
        key: "max_servers",
        value: "N",
        default: "256",
        doc: "Elastic: cap on servers; beyond it session creation waits up to \
            `wait_timeout_secs` (300 s) for a free seat, then fails (503) naming the cap.",
    },
    Setting {
        key: "wait_timeout_secs",
        value: "SECS",
        default: "300",
        doc: "Elastic: seconds session creation waits for a seat (all servers full at \
            `max_servers`, or servers still starting) before it fails with 503, naming \
            this key. Greater than 0.",
    },
    Setting {
        key: "drain_timeout_secs",
        value: "SECS",
        default: "120",
        doc: "Elastic: seconds the sessions of a server whose tunnel could not be repaired \
            may finish before the server is torn down anyway. Greater than 0.",
    },
    Setting {
        key: "server_idle_timeout_secs",
        value: "SECS",
        default: "300",
        doc: "Elastic: seconds a server must be empty before idle shrink may stop it (never \
            below `min_servers`); the pool's `idle_timeout`. Greater than 0.",
    },
    Setting {
        key: "static_servers",
        value: "N",
        default: "1",
        doc: "Static: how many identical servers (each with its own tunnel of the configured \
            kind).",
    },
    Setting {
        key: "tunnel",
        value: "none|custom|prime|bore",
        default: "`none`",
        doc: "How servers are exposed: `none` (loopback; every harness on this host), \
            `custom` (your own URL), `prime` (Prime Intellect's tunnel service) or `bore` \
            (a self-hosted bore server). Any value but `none` means a tunnel is \
            *required*: each server (each elastic server, each static server) gets one.",
    },
    Setting {
        key: "tunnel_url",
        value: "URL",
        default: "none; required with `custom`",
        doc: "Custom: the public `http(s)` URL that forwards to `tunnel_port`.",
    },
    Setting {
        key: "tunnel_port",
        value: "PORT",
        default: "none; required with `custom`",
        doc: "Custom: the local port the URL forwards to; the server listens there.",
    },
    Setting {
        key: "tunnel_host",
        value: "IP",
        default: "`0.0.0.0`",
        doc: "Custom: the address the server binds.",
    },
    Setting {
        key: "bore_server",
        value: "HOST",
        default: "none; required with `bore`",
        doc: "Bore: host name or IP of the `bore server` (no scheme, no port).",
    },
    Setting {
        key: "bore_port",
        value: "PORT",
        default: "7835",
        doc: "Bore: the bore server's control port.",
    },
    Setting {
        key: "bore_secret_env",
        value: "VAR",
        default: "none",
        doc: "Bore: *name* of the environment variable holding the bore server's secret \
            (never taken from a flag). Start fails if the variable is unset.",
    },
    Setting {
        key: "frpc_sha256",
        value: "HEX",
        default: "none",
        doc: "Prime: the SHA-256 (64 hex digits) of the frp release tarball for this \
            platform. Without it, frpc must be installed (`FRPC_PATH` or \
            `~/.prime/bin/frpc`): an unpinned download is never made. Refused with any \
            other tunnel.",
    },
    Setting {
        key: "rate_limit_backend",
        value: "file|redis",
        default: "`file`",
        doc: "Prime and bore: where the tunnel start rate limiter keeps its window: `file` \
            (every process of this host, under a file lock) or `redis` (a fleet of hosts \
            sharing `rate_limit_url`; see [tunnels.md](tunnels.md#a-fleet-of-hosts)). With \
            bore, `redis` also turns the limiter on. When Redis cannot be reached or does \
            not answer within 5 s the start fails closed: 503, counted in \
            `intercept_tunnel_limiter_unavailable_total`.",
    },
    Setting {
        key: "rate_limit_url",
        value: "URL",
        default: "none; required with `redis`",
        doc: "The Redis server of `rate_limit_backend = redis`: \
            `redis://[user:password@]host[:port][/db]`. The password is hidden in logs; \
            `INTERCEPT_RATE_LIMIT_URL` keeps it off the command line.",
    },
    Setting {
        key: "trace_dir",
        value: "DIR",
        default: "none",
        doc: "When set, each session's trace is appended to `<dir>/<session id>.jsonl` as \
            its calls end (the folder is created if missing), in `trace_format`.",
    },
    Setting {
        key: "trace_format",
        value: "log|full",
        default: "`log`",
        doc: "With `trace_dir`: `log`, the trace log of [traces.md](traces.md) (each \
            message, value and token written once; the episode is in it), or `full`, the \
            format of earlier versions for readers that cannot change yet (one whole record \
            per line, each repeating the conversation so far, and the episode in \
            `<dir>/<session id>.episode.json` at release).",
    },
    Setting {
        key: "log",
        value: "FILTER",
        default: "`$RUST_LOG`, else `info`",
        doc: "Log filter in `RUST_LOG` syntax, e.g. `intercept_server=debug,info`. Logs go \
            to stderr.",
    },
    Setting {
        key: "log_format",
        value: "text|json",
        default: "`text`",
        doc: "`text` or `json` (one JSON object per line).",
    },
    Setting {
        key: "shutdown_grace_secs",
        value: "SECS",
        default: "30",
        doc: "On SIGINT/SIGTERM, in-flight calls may finish for this long; the rest are \
            cancelled (and recorded as cancelled).",
    },
    Setting {
        key: "network_allow",
        value: "PATTERNS",
        default: "`*`",
        doc: "Network policy of sessions created without a `network` field: comma-separated \
            host patterns the provider may reach (`*`, `*.domain`, hosts); empty means \
            none.",
    },
    Setting {
        key: "network_block",
        value: "PATTERNS",
        default: "none",
        doc: "Comma-separated host patterns never allowed (default policy).",
    },
    Setting {
        key: "network_on_violation",
        value: "strip|reject",
        default: "`strip`",
        doc: "`strip` or `reject` (default policy).",
    },
    Setting {
        key: "header_read_timeout_secs",
        value: "SECS",
        default: "30",
        doc: "A client of the harness ports or the control API must send a whole request \
            head within this many seconds of opening the connection (or of the previous \
            answer), else the connection is closed. This is also the idle timeout of \
            kept-alive connections (HTTP/1 and HTTP/2); it never cuts a request in \
            progress or an answer being sent. `0`: no limit.",
    },
    Setting {
        key: "released_retention",
        value: "N",
        default: "4096",
        doc: "Released sessions the control API remembers (a count of sessions): their \
            status, trace and episode stay readable and their ids stay taken (creating one \
            again answers 409); the oldest are forgotten first (their JSONL files stay). \
            Late calls of a released session's harness get 409 from the servers, which \
            remember released secrets on their own (`ServerConfig::released_secrets`).",
    },
    Setting {
        key: "released_trace_bytes",
        value: "BYTES",
        default: "268435456 (256 MiB)",
        doc: "Without `trace_dir`: bytes of released traces (with their episodes) held in \
            memory so `GET /v1/sessions/{id}/trace` and `/episode` still answer; the \
            oldest are dropped first (their ids stay remembered; reading them answers \
            410), the newest always stays. With `trace_dir` nothing is held: released \
            traces are read back from their files.",
    },
    Setting {
        key: "trace_queue_bytes",
        value: "BYTES",
        default: "67108864 (64 MiB)",
        doc: "With `trace_dir`: most bytes of trace lines handed to the trace writer and not \
            yet written. While it is full a call waits in its record step until the writer \
            made room (a slow or stopped disk slows the calls instead of growing memory; \
            the wait holds the call, not its event loop). Also the most a crash of the \
            process can lose (see [sidecar.md](sidecar.md#trace-files)).",
    },
    Setting {
        key: "trace_flush_secs",
        value: "SECS",
        default: "0.01",
        doc: "With `trace_dir`: longest time a trace line waits before the writer writes it \
            (lines of every session that arrive meanwhile go in the same batch, one \
            `writev` per file). A crash loses the lines of calls recorded in the last \
            interval. A release, shutdown and reading a live trace write the queue first.",
    },
    Setting {
        key: "max_connections",
        value: "N",
        default: "16384",
        doc: "`max_connections` of the servers, and the same cap for the control API: \
            connections served at once; one beyond it is answered 503 with `Retry-After: \
            1` and closed. `0`: no cap. With the open-file limit raised at start (see \
            [sidecar.md](sidecar.md#lifecycle)) the cap, not the descriptors, is what a \
            flood of connections meets first.",
    },
    Setting {
        key: "workers",
        value: "N",
        default: "0 (one per core)",
        doc: "`workers` of the servers: event loops serving the harnesses' connections, \
            each a thread with a single-threaded runtime and its own listening socket on \
            the server's port (`SO_REUSEPORT`), its own upstream connections and caches; a \
            connection and its calls stay on one loop. `0`: one per core the process may \
            use (its CPU affinity, as `taskset` sets it, honoured). The control API runs \
            apart from them.",
    },
    Setting {
        key: "max_response_bytes",
        value: "BYTES",
        default: "268435456 (256 MiB)",
        doc: "`max_response_bytes` of the servers: the largest upstream answer read for one \
            call (a JSON body, declared or received, or all the bytes of a stream). Past \
            it the call fails with 502 (`upstream_malformed`, naming the limit and the \
            bytes received), the upstream connection is closed, and the record is marked \
            `truncated`; a stream already under way ends with the dialect's error event.",
    },
    Setting {
        key: "upstream_write_idle_secs",
        value: "SECS",
        default: "30",
        doc: "`upstream_write_idle` of the servers: seconds a plain-HTTP upstream may take \
            no byte of a request before the call fails (504). `0` turns it off.",
    },
    Setting {
        key: "upstream_read_idle_secs",
        value: "SECS",
        default: "0 (off)",
        doc: "`upstream_read_idle` of the servers: seconds a plain-HTTP upstream may send \
            nothing, once it has the request, before the call fails. `0` turns it off.",
    },
    Setting {
        key: "stream_heartbeat",
        value: "event|comment|off",
        default: "`event`",
        doc: "`stream_heartbeat` of the servers: what a stream carries every 3 s while its \
            upstream is silent. `event`: a dialect-valid event where the dialect's SDKs \
            accept one (Chat an empty `delta.content` chunk, Responses \
            `response.in_progress`, Anthropic a no-op `message_delta`), else a `: \
            keepalive` comment; `comment`: always the comment; `off`: nothing. Heartbeats \
            never reach the record (see [dialects.md](dialects.md#streams)).",
    },
    Setting {
        key: "models_timeout_secs",
        value: "SECS",
        default: "30",
        doc: "`models_timeout` of the servers: seconds `GET /v1/models` waits for the \
            session's upstream listing before it lists the session's model alone. Greater \
            than 0.",
    },
];

/// The keys of every setting, in [`SETTINGS`] order.
pub fn keys() -> impl Iterator<Item = &'static str> {
    SETTINGS.iter().map(|s| s.key)
}

/// The Markdown table of [`SETTINGS`] (`| key | default | what it does |`), as
/// `docs/configuration.md` holds it.
pub fn settings_table() -> String {
    let mut out =
        String::from("| key | default | what it does |\n|-----|---------|--------------|\n");
    for s in SETTINGS {
        out.push_str(&format!("| `{}` | {} | {} |\n", s.key, s.default, s.doc));
    }
    out
}
