//! The settings read from their layers, checked and converted.

use intercept_pool::InterceptionConfig;
use intercept_tunnel::TunnelConfig;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults() {
    let c = ServeConfig::from_layers(Layers {
        file: None,
        env: &env(&[("PATH", "/bin"), ("INTERCEPT_CONFIG", "x.toml")]),
        flags: &[],
    })
    .unwrap();
    assert_eq!(c.control, SocketAddr::from(([127, 0, 0, 1], 0)));
    assert_eq!(c.multiplex, 32);
    assert_eq!(c.upstream, None);
    assert_eq!(c.shutdown_grace, Duration::from_secs(30));
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(c.control_token.is_none());
}

#[test]
fn layers_override_in_order() {
    let file = "upstream = \"mock\"\nmodel = \"file\"\nmultiplex = 4\nlog_format = \"json\"\n\
                trace_dir = \"/tmp/file\"\nshutdown_grace_secs = 1.5\n";
    let e = env(&[
        ("INTERCEPT_MODEL", "env"),
        ("INTERCEPT_MULTIPLEX", "8"),
        ("INTERCEPT_CONTROL_TOKEN", "env-token"),
    ]);
    let flags = [("multiplex", "16".to_string())];
    let c = ServeConfig::from_layers(Layers {
        file: Some((Path::new("i.toml"), file)),
        env: &e,
        flags: &flags,
    })
    .unwrap();
    assert_eq!(c.upstream, Some(UpstreamSetting::Mock));
    assert_eq!(c.model.as_deref(), Some("env"));
    assert_eq!(c.multiplex, 16);
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.trace_dir, Some(PathBuf::from("/tmp/file")));
    assert_eq!(c.shutdown_grace, Duration::from_millis(1500));
    assert_eq!(c.control_token.unwrap().expose(), "env-token");
    let debug = format!(
        "{:?}",
        ServeConfig::from_layers(Layers {
            file: None,
            env: &e,
            flags: &[],
        })
        .unwrap()
    );
    assert!(!debug.contains("env-token"), "{debug}");
}

fn err(file: Option<&str>, e: &[(&str, &str)], flags: &[(&str, &str)]) -> ConfigError {
    let e = env(e);
    let flags: Vec<(&str, String)> = flags.iter().map(|(k, v)| (*k, v.to_string())).collect();
    ServeConfig::from_layers(Layers {
        file: file.map(|t| (Path::new("i.toml"), t)),
        env: &e,
        flags: &flags,
    })
    .unwrap_err()
}

#[test]
fn unknown_keys_are_named() {
    let e = err(Some("multiplx = 3\n"), &[], &[]);
    assert!(matches!(e, ConfigError::UnknownKey { ref key, .. } if key == "multiplx"));
    assert!(e.to_string().contains("config file i.toml"), "{e}");
    // Unknown environment variables are warnings naming the closest setting, and
    // the ones that are settings still apply.
    let vars = env(&[
        ("INTERCEPT_MULTIPLX", "3"),
        ("INTERCEPT_BIN", "/usr/local/bin/intercept"),
        ("INTERCEPT_MODEL", "m"),
    ]);
    let c = ServeConfig::from_layers(Layers {
        file: None,
        env: &vars,
        flags: &[],
    })
    .expect("unknown variables are not errors");
    assert_eq!(c.model.as_deref(), Some("m"));
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
    assert!(
        c.warnings[0].contains("INTERCEPT_MULTIPLX")
            && c.warnings[0].contains("did you mean INTERCEPT_MULTIPLEX?"),
        "{:?}",
        c.warnings
    );
    assert!(c.warnings[1].contains("INTERCEPT_BIN"), "{:?}", c.warnings);
    let e = err(None, &[], &[("nope", "1")]);
    assert_eq!(e.key(), Some("--nope"));
    let e = err(Some("[server]\nport = 1\n"), &[], &[]);
    assert_eq!(e.key(), Some("server"));
    let e = err(Some("model = [1]\n"), &[], &[]);
    assert!(matches!(e, ConfigError::BadValue { ref key, .. } if key == "model"));
    let e = err(Some("this is = = not toml"), &[], &[]);
    assert!(matches!(e, ConfigError::File { .. }), "{e}");
}

#[test]
fn settings_document_every_field_in_order() {
    let probe = Layer::strings(Source::Flag, [("?", "")].into_iter());
    let e = Figment::from(probe).extract::<ServeConfig>().unwrap_err();
    let figment::error::Kind::UnknownField(_, fields) = e.kind else {
        panic!("{e}")
    };
    assert_eq!(fields, keys().collect::<Vec<_>>());
    let table = settings_table();
    assert_eq!(table.lines().count(), SETTINGS.len() + 2);
    assert!(
        table.contains("| `multiplex` | 32 | Sessions per server"),
        "{table}"
    );
}

#[test]
fn messages_name_the_key_and_the_source() {
    let cases = [
        (
            err(None, &[], &[("multiplex", "zero")]),
            "invalid value for `--multiplex` (command line): \"zero\" is not a positive \
             integer",
        ),
        (
            err(None, &[("INTERCEPT_MULTIPLEX", " lots ")], &[]),
            "invalid value for `INTERCEPT_MULTIPLEX` (environment): \"lots\" is not a \
             positive integer",
        ),
        (
            err(Some("multiplex = 0\n"), &[], &[]),
            "invalid value for `multiplex` (config file i.toml): \"0\" is not a positive \
             integer",
        ),
        (
            err(Some("shutdown_grace_secs = -1.5\n"), &[], &[]),
            "invalid value for `shutdown_grace_secs` (config file i.toml): \"-1.5\" is not \
             a number of seconds (>= 0)",
        ),
        (
            err(Some("model = [1]\n"), &[], &[]),
            "invalid value for `model` (config file i.toml): expected a string or a number, \
             not a table or array",
        ),
        // A bad value fails even when a higher layer overrides it.
        (
            err(
                Some("multiplex = \"x\"\n"),
                &[("INTERCEPT_MULTIPLEX", "8")],
                &[],
            ),
            "invalid value for `multiplex` (config file i.toml): \"x\" is not a positive \
             integer",
        ),
        (
            err(None, &[("INTERCEPT_MULTIPLEX", "x")], &[("multiplex", "8")]),
            "invalid value for `INTERCEPT_MULTIPLEX` (environment): \"x\" is not a \
             positive integer",
        ),
    ];
    for (e, message) in cases {
        assert_eq!(e.to_string(), message);
    }
    let e = err(Some("multiplx = 3\n"), &[], &[]).to_string();
    assert!(
        e.starts_with(
            "unknown setting `multiplx` (config file i.toml); known settings: upstream, \
             upstream_api_key_env, "
        ),
        "{e}"
    );
    let e = err(None, &[], &[("nope", "1")]).to_string();
    assert!(
        e.starts_with("unknown setting `--nope` (command line); known settings: --upstream, "),
        "{e}"
    );
}

#[test]
fn every_bad_value_names_its_key() {
    let cases: &[(&str, &str)] = &[
        ("upstream", "ftp://x"),
        ("upstream", "not a url"),
        ("upstream_api_key_env", "sk-abc def"),
        ("upstream_api_key_env", ""),
        ("model", " "),
        ("control", "localhost"),
        ("control", "0.0.0.0:80"),
        ("control_token", "has space"),
        ("control_token", ""),
        ("interception", "cluster"),
        ("interception", "Elastic"),
        ("multiplex", "0"),
        ("multiplex", "-1"),
        ("multiplex", "x"),
        ("min_servers", "-1"),
        ("min_servers", "some"),
        ("max_servers", "0"),
        ("max_servers", "1.5"),
        ("wait_timeout_secs", "0"),
        ("wait_timeout_secs", "soon"),
        ("drain_timeout_secs", "-1"),
        ("server_idle_timeout_secs", "x"),
        ("frpc_sha256", "abc"),
        ("frpc_sha256", &"g".repeat(64)),
        ("static_servers", "0"),
        ("static_servers", "two"),
        ("tunnel", "ngrok"),
        ("tunnel", ""),
        ("tunnel_url", "rollouts.example.com"),
        ("tunnel_url", "ftp://rollouts.example.com"),
        ("tunnel_url", ""),
        ("tunnel_port", "0"),
        ("tunnel_port", "65536"),
        ("tunnel_port", "http"),
        ("tunnel_host", "localhost"),
        ("tunnel_host", "0.0.0.0:80"),
        ("bore_server", ""),
        ("bore_server", "http://bore.example"),
        ("bore_server", "bore.example:7835"),
        ("bore_port", "0"),
        ("bore_port", "70000"),
        ("bore_secret_env", "s3cret value"),
        ("bore_secret_env", ""),
        ("trace_dir", ""),
        ("log", "info,[[["),
        ("log_format", "xml"),
        ("shutdown_grace_secs", "-1"),
        ("shutdown_grace_secs", "soon"),
        ("released_retention", "-5"),
        ("released_trace_bytes", "256MiB"),
        ("trace_queue_bytes", "0"),
        ("trace_flush_secs", "-1"),
        ("max_response_bytes", "0"),
        ("max_connections", "-1"),
        ("max_connections", "many"),
        ("max_response_bytes", "1GB"),
        ("upstream_write_idle_secs", "-1"),
        ("upstream_write_idle_secs", "never"),
        ("upstream_read_idle_secs", "1e400"),
        ("upstream_read_idle_secs", ""),
        ("network_allow", "https://example.org"),
        ("network_block", "*.x.org, a:80"),
        ("network_on_violation", "drop"),
        ("rate_limit_backend", "memcached"),
        ("rate_limit_url", "http://u:pw@redis.example:6379/"),
        ("tokens", "qwen3"),
        ("tokens", "true"),
        ("tokens", "[1]"),
        ("tokens", r#"{"renderer": "qwen3"}"#),
        ("tokens", r#"{"renderer": "qwen3", "tokenizer": ""}"#),
        (
            "tokens",
            r#"{"renderer": "qwen3", "tokenizer": "/m", "engine": "tgi"}"#,
        ),
        (
            "tokens",
            r#"{"renderer": "qwen3", "tokenizer": "/m", "thinking": true}"#,
        ),
    ];
    for (key, value) in cases {
        let e = err(None, &[], &[(key, value)]);
        let flag = format!("--{}", key.replace('_', "-"));
        assert_eq!(e.key(), Some(flag.as_str()), "{key}={value}: {e}");
        assert!(e.to_string().contains(&flag), "{e}");
        let var = format!("INTERCEPT_{}", key.to_ascii_uppercase());
        let e = err(None, &[(&var, value)], &[]);
        assert_eq!(e.key(), Some(var.as_str()), "{key}={value}: {e}");
        let toml = format!("{key} = {}\n", toml::Value::String(value.to_string()));
        let e = err(Some(&toml), &[], &[]);
        assert_eq!(e.key(), Some(*key), "{key}={value}: {e}");
    }
}

#[test]
fn settings_that_do_not_fit_together_name_the_key() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("tunnel", "custom")], "tunnel_url"),
        (
            &[("tunnel", "custom"), ("tunnel_url", "https://x.example")],
            "tunnel_port",
        ),
        (
            &[
                ("tunnel", "custom"),
                ("tunnel_url", "https://x.example"),
                ("tunnel_port", "8080"),
                ("interception", "elastic"),
            ],
            "tunnel",
        ),
        (
            &[
                ("tunnel", "custom"),
                ("tunnel_url", "https://x.example"),
                ("tunnel_port", "8080"),
                ("interception", "static"),
                ("static_servers", "2"),
            ],
            "static_servers",
        ),
        (&[("tunnel", "bore")], "bore_server"),
        (&[("tunnel_url", "https://x.example")], "tunnel_url"),
        (&[("tunnel_port", "8080")], "tunnel_port"),
        (&[("tunnel_host", "127.0.0.1")], "tunnel_host"),
        (
            &[("tunnel", "prime"), ("bore_server", "b.example")],
            "bore_server",
        ),
        (&[("bore_port", "7000")], "bore_port"),
        (
            &[("tunnel", "custom"), ("bore_secret_env", "S")],
            "bore_secret_env",
        ),
        (&[("min_servers", "5"), ("max_servers", "4")], "min_servers"),
        (
            &[("tunnel", "bore"), ("frpc_sha256", &"a".repeat(64))],
            "frpc_sha256",
        ),
        (
            &[("tunnel", "prime"), ("rate_limit_backend", "redis")],
            "rate_limit_url",
        ),
        (
            &[("tunnel", "prime"), ("rate_limit_url", "redis://r:6379/")],
            "rate_limit_url",
        ),
        (
            &[
                ("rate_limit_backend", "redis"),
                ("rate_limit_url", "redis://r:6379/"),
            ],
            "rate_limit_backend",
        ),
    ];
    for (flags, key) in cases {
        let e = err(None, &[], flags);
        assert!(
            matches!(e, ConfigError::Inconsistent { key: ref k, .. } if k == key),
            "{flags:?}: {e}"
        );
        assert_eq!(e.key(), Some(*key));
        assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
    }
}

#[test]
fn pools_and_tunnels_parse_in_every_layer() {
    let file = "interception = \"static\"\nstatic_servers = 3\ntunnel = \"bore\"\n\
                bore_server = \"bore.example\"\nbore_port = 9000\n";
    let e = env(&[
        ("INTERCEPT_BORE_SECRET_ENV", "MY_BORE_SECRET"),
        ("INTERCEPT_MAX_SERVERS", "8"),
    ]);
    let flags = [
        ("interception", "elastic".to_string()),
        ("multiplex", "2".to_string()),
        ("min_servers", "0".to_string()),
    ];
    let c = ServeConfig::from_layers(Layers {
        file: Some((Path::new("i.toml"), file)),
        env: &e,
        flags: &flags,
    })
    .unwrap();
    assert_eq!(c.interception, Shape::Elastic);
    assert_eq!(c.static_servers, 3);
    assert_eq!((c.multiplex, c.min_servers, c.max_servers), (2, Some(0), 8));
    assert_eq!(c.tunnel, TunnelSetting::Bore);
    assert_eq!(c.bore_server.as_deref(), Some("bore.example"));
    assert_eq!(c.bore_port, Some(9000));
    assert_eq!(c.bore_secret_env.as_deref(), Some("MY_BORE_SECRET"));

    let tunnel = c.tunnel_config(Some("hush".into())).unwrap();
    let TunnelConfig::Bore(bore) = &tunnel else {
        panic!("{tunnel:?}")
    };
    assert_eq!(bore.server, "bore.example");
    assert_eq!(bore.control_port, 9000);
    assert_eq!(bore.secret.as_deref(), Some("hush"));
    let InterceptionConfig::Elastic(entry) = c.interception_config(tunnel.clone()) else {
        panic!("elastic")
    };
    assert_eq!(entry.pool.multiplex, 2);
    assert_eq!(entry.pool.min_servers, Some(0));
    assert_eq!(entry.pool.max_servers, 8);
    assert_eq!(entry.tunnel, tunnel);

    let c = ServeConfig {
        interception: Shape::Static,
        static_servers: 3,
        ..ServeConfig::default()
    };
    let InterceptionConfig::Static(entry) = c.interception_config(TunnelConfig::None) else {
        panic!("static")
    };
    assert_eq!(entry.servers.len(), 3);

    let flags = [
        ("tunnel", "custom".to_string()),
        ("tunnel_url", "https://rollouts.example.com/".to_string()),
        ("tunnel_port", "8765".to_string()),
        ("tunnel_host", "127.0.0.1".to_string()),
    ];
    let c = ServeConfig::from_layers(Layers {
        file: None,
        env: &[],
        flags: &flags,
    })
    .unwrap();
    let TunnelConfig::Custom(custom) = c.tunnel_config(None).unwrap() else {
        panic!("custom")
    };
    assert_eq!(custom.url, "https://rollouts.example.com");
    assert_eq!(custom.port, 8765);
    assert!(custom.host.is_loopback());
    assert!(matches!(
        c.interception_config(TunnelConfig::None),
        InterceptionConfig::Server(_)
    ));

    let c = ServeConfig {
        tunnel: TunnelSetting::Prime,
        ..ServeConfig::default()
    };
    assert!(matches!(
        c.tunnel_config(None).unwrap(),
        TunnelConfig::Prime(_)
    ));
    assert_eq!(
        ServeConfig::default().tunnel_config(None).unwrap(),
        TunnelConfig::None
    );
    assert_eq!(ServeConfig::default().interception, Shape::Server);
}

#[test]
fn good_values_parse() {
    let flags = [
        ("upstream", "https://api.example.com/v1/".to_string()),
        ("upstream_api_key_env", "MY_KEY".to_string()),
        ("control", "127.0.0.1:7700".to_string()),
        ("control", "[::1]:7700".to_string()),
        ("log", "intercept_server=debug,info".to_string()),
        ("released_retention", "0".to_string()),
        ("released_trace_bytes", "1048576".to_string()),
        ("max_response_bytes", "2097152".to_string()),
        ("max_connections", "0".to_string()),
        ("network_allow", "*.python.org, files.test".to_string()),
        ("network_block", "evil.python.org".to_string()),
        ("network_on_violation", "reject".to_string()),
    ];
    let c = ServeConfig::from_layers(Layers {
        file: None,
        env: &[],
        flags: &flags,
    })
    .unwrap();
    assert_eq!(
        c.upstream,
        Some(UpstreamSetting::Url("https://api.example.com/v1".into()))
    );
    assert_eq!(c.upstream_api_key_env.as_deref(), Some("MY_KEY"));
    assert_eq!(c.control.port(), 7700);
    assert!(c.control.is_ipv6());
    assert_eq!(c.released_retention, 0);
    assert_eq!(c.released_trace_bytes, 1 << 20);
    assert_eq!(c.max_response_bytes, 2 << 20);
    assert_eq!(c.max_connections, None);
    assert!(c.network().unwrap().is_restricted());
    assert!(c.network().unwrap().allows_host("docs.python.org"));
    assert!(!c.network().unwrap().allows_host("evil.python.org"));
    assert_eq!(c.network().unwrap().on_violation(), OnViolation::Reject);
    assert!(!ServeConfig::default().network().unwrap().is_restricted());
    let none = ServeConfig::from_layers(Layers {
        file: None,
        env: &[],
        flags: &[("network_allow", String::new())],
    })
    .unwrap();
    assert!(!none.network().unwrap().allows_host("python.org"));
}

#[test]
fn upstream_idle_timeouts_default_and_turn_off_with_zero() {
    let c = ServeConfig::default();
    assert_eq!(c.upstream_write_idle, Some(Duration::from_secs(30)));
    assert_eq!(c.upstream_read_idle, None);
    let file = "upstream_write_idle_secs = 0\nupstream_read_idle_secs = 600\n";
    let e = env(&[("INTERCEPT_UPSTREAM_READ_IDLE_SECS", "90.5")]);
    let c = ServeConfig::from_layers(Layers {
        file: Some((Path::new("i.toml"), file)),
        env: &e,
        flags: &[],
    })
    .unwrap();
    assert_eq!(c.upstream_write_idle, None);
    assert_eq!(c.upstream_read_idle, Some(Duration::from_millis(90_500)));
    let flags = [("upstream_write_idle_secs", "5".to_string())];
    let c = ServeConfig::from_layers(Layers {
        file: None,
        env: &[],
        flags: &flags,
    })
    .unwrap();
    assert_eq!(c.upstream_write_idle, Some(Duration::from_secs(5)));
}

#[test]
fn pool_timeouts_and_the_frpc_checksum_reach_the_pool_and_the_tunnel() {
    let c = ServeConfig::default();
    assert_eq!(c.wait_timeout, Duration::from_secs(300));
    assert_eq!(c.drain_timeout, Duration::from_secs(120));
    assert_eq!(c.server_idle_timeout, Duration::from_secs(300));
    let sha = "AB".repeat(32);
    let file = "interception = \"elastic\"\ntunnel = \"prime\"\nwait_timeout_secs = 2.5\n";
    let e = env(&[
        ("INTERCEPT_DRAIN_TIMEOUT_SECS", "7"),
        ("INTERCEPT_FRPC_SHA256", &sha),
    ]);
    let flags = [("server_idle_timeout_secs", "9".to_string())];
    let c = ServeConfig::from_layers(Layers {
        file: Some((Path::new("i.toml"), file)),
        env: &e,
        flags: &flags,
    })
    .unwrap();
    match c.interception_config(()) {
        InterceptionConfig::Elastic(e) => {
            assert_eq!(e.pool.wait_timeout, Duration::from_millis(2500));
            assert_eq!(e.pool.drain_timeout, Duration::from_secs(7));
            assert_eq!(e.pool.idle_timeout, Duration::from_secs(9));
            assert_eq!(e.pool.setting_names.wait_timeout, "wait_timeout_secs");
        }
        other => panic!("not elastic: {other:?}"),
    }
    match c.tunnel_config(None).unwrap() {
        TunnelConfig::Prime(p) => {
            let platform = intercept_tunnel::prime::install::platform();
            if let Some(platform) = platform {
                assert_eq!(p.frpc.sha256.get(platform), Some(&sha.to_ascii_lowercase()));
            }
            assert!(p.frpc.pin_hint.unwrap().contains("frpc_sha256"));
        }
        other => panic!("not prime: {other:?}"),
    }
}

#[test]
fn a_redis_rate_limiter_reaches_prime_and_bore_and_hides_its_password() {
    let url = "redis://fleet:pw@10.0.0.5:6379/2";
    let flags = |tunnel: &str| {
        let mut f = vec![
            ("tunnel", tunnel.to_string()),
            ("rate_limit_backend", "redis".to_string()),
            ("rate_limit_url", url.to_string()),
        ];
        if tunnel == "bore" {
            f.push(("bore_server", "b.example".to_string()));
        }
        ServeConfig::from_layers(Layers {
            file: None,
            env: &[],
            flags: &f,
        })
        .unwrap()
    };
    let c = flags("prime");
    let shown = format!("{c:?}");
    assert!(!shown.contains("pw"), "{shown}");
    match c.tunnel_config(None).unwrap() {
        TunnelConfig::Prime(p) => {
            assert_eq!(p.rate_limit.backend, LimiterBackend::Redis);
            assert_eq!(p.rate_limit.url.as_deref(), Some(url));
            assert_eq!(
                p.rate_limit.rate, 512,
                "the rest of the limiter is unchanged"
            );
        }
        other => panic!("not prime: {other:?}"),
    }
    match flags("bore").tunnel_config(None).unwrap() {
        TunnelConfig::Bore(b) => {
            assert!(b.rate_limit.enabled, "bore's limiter is turned on");
            assert_eq!(b.rate_limit.backend, LimiterBackend::Redis);
        }
        other => panic!("not bore: {other:?}"),
    }
    // Without the keys, Prime keeps its host-wide file limiter.
    let plain = ServeConfig::from_layers(Layers {
        file: None,
        env: &[],
        flags: &[("tunnel", "prime".to_string())],
    })
    .unwrap();
    match plain.tunnel_config(None).unwrap() {
        TunnelConfig::Prime(p) => assert_eq!(p.rate_limit.backend, LimiterBackend::File),
        other => panic!("not prime: {other:?}"),
    }
}

#[test]
fn tokens_is_a_table_in_the_file_and_json_elsewhere() {
    use intercept_core::{OnMismatch, TokenEngine, TokensConfig};
    let file = "[tokens]\nrenderer = \"qwen3\"\ntokenizer = \"/models/qwen3\"\n\
                engine = \"sglang\"\nenable_thinking = false\n";
    let c = ServeConfig::from_layers(Layers {
        file: Some((Path::new("i.toml"), file)),
        env: &[],
        flags: &[],
    })
    .unwrap();
    let mut expected = TokensConfig::new("qwen3", "/models/qwen3");
    expected.engine = TokenEngine::Sglang;
    expected.enable_thinking = Some(false);
    assert_eq!(c.tokens.as_ref(), Some(&expected));

    // The environment and the flags give its JSON; a layer replaces the one below whole.
    let json = r#"{"renderer": "qwen3", "tokenizer": "/m", "on_mismatch": "fail"}"#;
    let c = ServeConfig::from_layers(Layers {
        file: Some((Path::new("i.toml"), file)),
        env: &env(&[("INTERCEPT_TOKENS", json)]),
        flags: &[],
    })
    .unwrap();
    let mut expected = TokensConfig::new("qwen3", "/m");
    expected.on_mismatch = OnMismatch::Fail;
    assert_eq!(c.tokens.as_ref(), Some(&expected));
    let c = ServeConfig::from_layers(Layers {
        file: None,
        env: &env(&[("INTERCEPT_TOKENS", json)]),
        flags: &[(
            "tokens",
            r#"{"renderer":"qwen3","tokenizer":"/f"}"#.to_string(),
        )],
    })
    .unwrap();
    assert_eq!(c.tokens, Some(TokensConfig::new("qwen3", "/f")));

    // `off` (or JSON null, false) turns a lower layer's default off.
    for off in ["off", "null", "false", " none "] {
        let c = ServeConfig::from_layers(Layers {
            file: Some((Path::new("i.toml"), file)),
            env: &[],
            flags: &[("tokens", off.to_string())],
        })
        .unwrap();
        assert_eq!(c.tokens, None, "{off}");
    }
    assert_eq!(ServeConfig::default().tokens, None);

    // A bad table names the key, its source and the fields.
    let e = err(
        Some("[tokens]\nrenderer = \"qwen3\"\ntokenizer = \"/m\"\nengine = \"tgi\"\n"),
        &[],
        &[],
    )
    .to_string();
    assert!(
        e.starts_with(
            "invalid value for `tokens` (config file i.toml): tokens.engine: unknown variant `tgi`"
        ),
        "{e}"
    );
    assert!(
        e.contains("on_mismatch (\"render\", \"chat\" or \"fail\")"),
        "{e}"
    );
    let e = err(Some("[tokens]\nrenderer = \"qwen3\"\n"), &[], &[]).to_string();
    assert!(
        e.contains("missing field `tokenizer`") && !e.contains("default"),
        "{e}"
    );
    let e = err(None, &[("INTERCEPT_TOKENS", "{renderer: qwen3}")], &[]).to_string();
    assert!(
        e.starts_with(
            "invalid value for `INTERCEPT_TOKENS` (environment): \"{renderer: qwen3}\" is not JSON"
        ),
        "{e}"
    );
}
