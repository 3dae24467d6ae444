//! The Qwen3 renderer's cost on a generated 40-turn tool loop (a system prompt with
//! tools, a task, then turns of reasoning + one tool call + the tool's result):
//!
//! - `turn/bridge+parse/{1,10,20,40}`: what a turn costs a train client: the bridge that
//!   makes turn t's prompt from turn t-1's prompt, completion and tool result, plus the
//!   parse of turn t's completion. It must not grow with the turn;
//! - `turn/extend+parse/*`: the same with [`Renderer::extend`], which returns the ids to
//!   append instead of copying the whole context into a new prompt;
//! - `turn/bridge/*` and `turn/parse/*`: each alone;
//! - `render/full/{1,40}`: rendering the whole conversation instead;
//! - `stream/parse/40`: turn 40's completion parsed as a stream, id by id.
//!
//! The conversation is written to `target/intercept-tokens-bench/tool_loop.json`;
//! `benches/renderers_py.py` times renderers 0.1.12 on the same file. With
//! `INTERCEPT_PYTHON` set the bench runs it and prints both per-turn costs and their
//! ratio. It also prints the memory of one loaded tokenizer and of a renderer.
//! Needs `INTERCEPT_QWEN3_TOKENIZER` (a folder with Qwen3's tokenizer files).

// `criterion_group!` generates undocumented public items.
#![allow(missing_docs)]
// A measuring program: wall-clock timing outside any runtime.
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use intercept_tokens::{
    ChatMessage, Qwen3Renderer, Renderer, RendererOptions, Tokenizer, ToolCallIn, ToolSpec,
};

const TURNS: usize = 40;
const MEASURED: [usize; 4] = [1, 10, 20, 40];

/// A small deterministic generator (xorshift64*), so that every run and the Python
/// script see the same conversation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// An identifier-like word made of syllables: most words of a long tool loop are
    /// new to a word cache, as in real logs and code.
    fn word(&mut self) -> String {
        const SYLLABLES: &[&str] = &[
            "ka", "ren", "do", "tor", "vi", "ex", "par", "sel", "mu", "lo", "qui", "ang", "st",
            "or", "bu", "fe", "ni", "gra", "phy", "zo",
        ];
        let n = 1 + self.below(3);
        let mut w = String::new();
        for k in 0..n {
            if k > 0 && self.below(4) == 0 {
                w.push('_');
            }
            w.push_str(self.pick(SYLLABLES));
        }
        w
    }

    /// Prose-, log- and code-like text of about `chars` characters.
    fn text(&mut self, chars: usize) -> String {
        const WORDS: &[&str] = &[
            "the",
            "file",
            "test",
            "function",
            "returns",
            "error",
            "value",
            "None",
            "self",
            "config",
            "path",
            "=",
            "(",
            ")",
            ":",
            "->",
            "import",
            "def",
            "class",
            "if",
            "return",
            "for",
            "in",
            "line",
            "ok",
            "failed",
            "assert",
            "src/main.rs",
            "Ü",
            "naïve",
            "数据",
            "✓",
            "😀",
            "\n",
            "\n",
            "    ",
            "\n\n",
            "#",
            "{",
            "}",
            "\"x\"",
        ];
        let mut s = String::new();
        while s.len() < chars {
            let w = match self.below(3) {
                0 => self.word(),
                1 if self.below(3) == 0 => format!("{}", self.next() % 100_000),
                _ => self.pick(WORDS).to_owned(),
            };
            if !s.is_empty() && !s.ends_with('\n') && !w.starts_with('\n') {
                s.push(' ');
            }
            s.push_str(&w);
        }
        s
    }
}

/// One turn of the loop: what the model wrote and what the tool answered.
struct Turn {
    reasoning: String,
    call_id: String,
    name: &'static str,
    /// The arguments' JSON, as the model wrote it.
    arguments: String,
    result: String,
}

struct Loop {
    system: String,
    task: String,
    tools_json: String,
    turns: Vec<Turn>,
}

fn tool_loop() -> Loop {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let names = ["run_bash", "read_file", "edit_file", "search"];
    let tools: Vec<String> = names
        .iter()
        .map(|n| {
            format!(
                r#"{{"type": "function", "function": {{"name": "{n}", "description": "{}", "parameters": {{"type": "object", "properties": {{"arg": {{"type": "string", "description": "what to act on"}}, "timeout": {{"type": "integer"}}}}, "required": ["arg"]}}}}}}"#,
                rng.text(120).replace(['\n', '"'], " ")
            )
        })
        .collect();
    let turns = (0..=TURNS)
        .map(|k| {
            let name = names[rng.below(names.len())];
            let arg = rng.text(40).replace(['\n', '"', '\\'], " ");
            let result_len = 200 + rng.below(1200);
            let reasoning_len = 150 + rng.below(450);
            Turn {
                reasoning: rng.text(reasoning_len),
                call_id: format!("call_{k}"),
                name,
                arguments: format!(r#"{{"arg": "{arg}", "timeout": {}}}"#, 10 + rng.below(50)),
                result: rng.text(result_len),
            }
        })
        .collect();
    Loop {
        system: "You are a coding agent. Use the tools to solve the task.".into(),
        task: rng.text(300),
        tools_json: format!("[{}]", tools.join(", ")),
        turns,
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

impl Loop {
    /// The completion text of turn `k` (without its `<|im_end|>`).
    fn completion(&self, k: usize) -> String {
        let t = &self.turns[k];
        format!(
            "<think>\n{}\n</think>\n\n<tool_call>\n{{\"name\": \"{}\", \"arguments\": {}}}\n</tool_call>",
            t.reasoning, t.name, t.arguments
        )
    }

    /// The file `renderers_py.py` reads.
    fn json(&self) -> String {
        let turns: Vec<String> = self
            .turns
            .iter()
            .enumerate()
            .map(|(k, t)| {
                format!(
                    r#"{{"completion": {}, "reasoning": {}, "call_id": {}, "name": {}, "arguments": {}, "result": {}}}"#,
                    quote(&self.completion(k)),
                    quote(&t.reasoning),
                    quote(&t.call_id),
                    quote(t.name),
                    quote(&t.arguments),
                    quote(&t.result)
                )
            })
            .collect();
        format!(
            r#"{{"system": {}, "task": {}, "tools": {}, "measured": {:?}, "turns": [{}]}}"#,
            quote(&self.system),
            quote(&self.task),
            self.tools_json,
            MEASURED,
            turns.join(",\n")
        )
    }

    fn start(&self) -> Vec<ChatMessage> {
        vec![
            ChatMessage::system(self.system.clone()),
            ChatMessage::user(self.task.clone()),
        ]
    }

    fn tool(&self, k: usize) -> ChatMessage {
        ChatMessage::tool(self.turns[k].call_id.clone(), self.turns[k].result.clone())
    }

    /// The whole conversation up to turn `k`'s prompt.
    fn messages(&self, k: usize) -> Vec<ChatMessage> {
        let mut m = self.start();
        for (j, t) in self.turns[..k].iter().enumerate() {
            m.push(ChatMessage::assistant(
                None,
                Some(t.reasoning.clone()),
                vec![ToolCallIn::new(
                    Some(t.call_id.clone()),
                    t.name,
                    t.arguments.clone(),
                )],
            ));
            m.push(self.tool(j));
        }
        m
    }
}

/// The prompts and completions of every turn, as a train client chains them.
struct Chain {
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
}

fn chain(r: &Qwen3Renderer, tok: &Tokenizer, l: &Loop, tools: &[ToolSpec]) -> Chain {
    let im_end = tok.token_id("<|im_end|>").expect("Qwen3 has <|im_end|>");
    let completions: Vec<Vec<u32>> = (0..=TURNS)
        .map(|k| {
            let mut c = tok.encode(&l.completion(k));
            c.push(im_end);
            c
        })
        .collect();
    let mut prompts = vec![
        r.render(&l.start(), tools, true)
            .expect("renders")
            .token_ids,
    ];
    for k in 1..=TURNS {
        let next = r
            .bridge(
                &prompts[k - 1],
                &completions[k - 1],
                &[l.tool(k - 1)],
                tools,
            )
            .expect("a tool loop bridges");
        prompts.push(next.token_ids);
    }
    Chain {
        prompts,
        completions,
    }
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")));
    target.join("intercept-tokens-bench")
}

/// The mean of `f` over enough runs to fill about `budget`.
fn mean(budget: Duration, mut f: impl FnMut()) -> Duration {
    f();
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < budget || n < 10 {
        f();
        n += 1;
    }
    start.elapsed() / n
}

fn main() {
    let Some(tokenizer_dir) = std::env::var_os("INTERCEPT_QWEN3_TOKENIZER") else {
        eprintln!("notice: INTERCEPT_QWEN3_TOKENIZER is not set; nothing to measure");
        return;
    };
    let before = rss_bytes();
    let t0 = Instant::now();
    let tok = Arc::new(Tokenizer::load(&tokenizer_dir).expect("the Qwen3 tokenizer loads"));
    let load_time = t0.elapsed();
    let after_tokenizer = rss_bytes();
    let r = Qwen3Renderer::new(tok.clone(), RendererOptions::default()).expect("a Qwen3 tokenizer");
    let after_renderer = rss_bytes();

    let l = tool_loop();
    let tools = ToolSpec::parse_raw_array(&l.tools_json).expect("the tools read");
    let c = chain(&r, &tok, &l, &tools);
    let dir = out_dir();
    std::fs::create_dir_all(&dir).expect("the bench's folder");
    let data = dir.join("tool_loop.json");
    std::fs::write(&data, l.json()).expect("the conversation is written");

    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    {
        let mut g = criterion.benchmark_group("turn");
        for &k in &MEASURED {
            let tail = [l.tool(k - 1)];
            g.bench_with_input(BenchmarkId::new("bridge+parse", k), &k, |b, &k| {
                b.iter(|| {
                    let next = r
                        .bridge(&c.prompts[k - 1], &c.completions[k - 1], &tail, &tools)
                        .expect("bridges");
                    black_box(r.parse(&c.completions[k], &next.token_ids))
                })
            });
            g.bench_with_input(BenchmarkId::new("extend+parse", k), &k, |b, &k| {
                b.iter(|| {
                    let next = r
                        .extend(&c.prompts[k - 1], &c.completions[k - 1], &tail, &tools)
                        .expect("extends");
                    black_box(next);
                    black_box(r.parse(&c.completions[k], &c.prompts[k]))
                })
            });
            g.bench_with_input(BenchmarkId::new("bridge", k), &k, |b, &k| {
                b.iter(|| {
                    black_box(
                        r.bridge(&c.prompts[k - 1], &c.completions[k - 1], &tail, &tools)
                            .expect("bridges"),
                    )
                })
            });
            g.bench_with_input(BenchmarkId::new("parse", k), &k, |b, &k| {
                b.iter(|| black_box(r.parse(&c.completions[k], &c.prompts[k])))
            });
        }
        g.finish();
    }
    {
        let mut g = criterion.benchmark_group("render");
        for k in [1, TURNS] {
            let messages = l.messages(k);
            g.bench_with_input(BenchmarkId::new("full", k), &k, |b, _| {
                b.iter(|| black_box(r.render(&messages, &tools, true).expect("renders")))
            });
        }
        g.finish();
    }
    {
        let mut g = criterion.benchmark_group("stream");
        g.bench_function("parse/40", |b| {
            b.iter(|| {
                let mut s = r.stream(&c.prompts[TURNS]);
                let mut n = 0;
                for id in &c.completions[TURNS] {
                    n += s.push(std::slice::from_ref(id)).len();
                }
                n += s.finish().len();
                black_box(n)
            })
        });
        g.finish();
    }
    criterion.final_summary();

    // A summary in one place, with the Python reference on the same conversation.
    let mib = |b: Option<u64>, a: Option<u64>| match (b, a) {
        (Some(b), Some(a)) => format!("{:.1} MiB", a.saturating_sub(b) as f64 / 1048576.0),
        _ => "unknown".into(),
    };
    println!("\nsummary");
    println!(
        "  tokenizer: loaded in {:.0} ms, RSS +{} (of which this crate's tables: {:.1} MiB); renderer: RSS +{} (the struct: {} B, plus the ids of five fixed texts)",
        load_time.as_secs_f64() * 1e3,
        mib(before, after_tokenizer),
        tok.table_bytes() as f64 / 1048576.0,
        mib(after_tokenizer, after_renderer),
        std::mem::size_of::<Qwen3Renderer>(),
    );
    let t0 = Instant::now();
    let hf = tokenizers::Tokenizer::from_file(
        std::path::Path::new(&tokenizer_dir).join("tokenizer.json"),
    )
    .expect("tokenizer.json loads");
    println!(
        "  the Hugging Face tokenizer alone loads in {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    drop(hf);
    println!(
        "  turn-40 prompt: {} ids; completion ids per turn: {}..{}",
        c.prompts[TURNS].len(),
        c.completions.iter().map(Vec::len).min().unwrap_or(0),
        c.completions.iter().map(Vec::len).max().unwrap_or(0)
    );
    let budget = Duration::from_millis(300);
    let mut rust_turn = Vec::new();
    for &k in &MEASURED {
        let tail = [l.tool(k - 1)];
        let per = mean(budget, || {
            let next = r
                .bridge(&c.prompts[k - 1], &c.completions[k - 1], &tail, &tools)
                .expect("bridges");
            black_box(r.parse(&c.completions[k], &next.token_ids));
        });
        rust_turn.push(per);
        let ext = mean(budget, || {
            black_box(
                r.extend(&c.prompts[k - 1], &c.completions[k - 1], &tail, &tools)
                    .expect("extends"),
            );
            black_box(r.parse(&c.completions[k], &c.prompts[k]));
        });
        println!(
            "  rust   turn {k:>2}: bridge+parse {:>8.1} µs (extend+parse, without copying the context: {:.1} µs)",
            per.as_secs_f64() * 1e6,
            ext.as_secs_f64() * 1e6
        );
    }
    let messages = l.messages(TURNS);
    let full = mean(budget, || {
        black_box(r.render(&messages, &tools, true).expect("renders"));
    });
    println!(
        "  rust   full render at turn 40: {:.1} µs",
        full.as_secs_f64() * 1e6
    );

    let Some(python) = std::env::var_os("INTERCEPT_PYTHON") else {
        println!("  (set INTERCEPT_PYTHON to a Python with renderers==0.1.12 to time it on the same turns)");
        return;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/renderers_py.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(&data)
        .arg(std::env::var_os("INTERCEPT_QWEN3_TOKENIZER").unwrap_or_default())
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .expect("the Python reference runs");
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        println!(
            "  the Python reference failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let report: serde_json::Value = match text.lines().last().map(serde_json::from_str) {
        Some(Ok(v)) => v,
        _ => {
            println!("  the Python reference printed no report:\n{text}");
            return;
        }
    };
    println!(
        "  python tokenizer+renderer: RSS +{:.1} MiB, loaded in {:.0} ms",
        report["rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
        report["load_ms"].as_f64().unwrap_or(0.0)
    );
    for (i, &k) in MEASURED.iter().enumerate() {
        let py = report["turn_us"][i].as_f64().unwrap_or(f64::NAN);
        let py_cpu = report["turn_cpu_us"][i].as_f64().unwrap_or(f64::NAN);
        let ours = rust_turn[i].as_secs_f64() * 1e6;
        println!(
            "  python turn {k:>2}: bridge+parse {py:>8.1} µs (CPU {py_cpu:.1} µs)  → {:.1}× the Rust time",
            py / ours
        );
    }
    let py_full = report["full_render_us"].as_f64().unwrap_or(f64::NAN);
    println!(
        "  python full render at turn 40: {py_full:.1} µs → {:.1}× the Rust time",
        py_full / (full.as_secs_f64() * 1e6)
    );
}
