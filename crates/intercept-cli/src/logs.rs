//! The binary's log output: one line per event, whatever text the event carries.
//!
//! Log events carry foreign text: upstream error bodies, harness-sent strings, tunnel
//! helpers' output. The libraries put such text in `Debug` fields (escaped), and
//! [`Escaping`] closes the class for every event, including those of dependencies: each
//! line the formatter writes goes out with its control characters escaped (`\n`, `\r`,
//! `\t`, `\0`, `\u{1b}`, ...), so no text can end a line early, forge the next one, or
//! drive the terminal. The JSON format is escaped by its encoder already.

use std::io::{self, Write};

/// A writer that escapes control characters inside each formatted log line.
///
/// The `fmt` subscriber formats one event into a buffer and writes it with one
/// `write_all`; its final newline is kept, every other control character is escaped.
/// With `keep_ansi` (colours on a terminal) the escape character is kept for the
/// formatter's own colour codes; foreign text in `Debug` fields is escaped anyway.
#[derive(Debug)]
pub struct Escaping<W> {
    inner: W,
    keep_ansi: bool,
}

impl<W> Escaping<W> {
    /// Wraps `inner`.
    pub fn new(inner: W, keep_ansi: bool) -> Self {
        Escaping { inner, keep_ansi }
    }
}

fn escape_into(out: &mut String, line: &str, keep_ansi: bool) {
    for c in line.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            '\u{1b}' if keep_ansi => out.push(c),
            c if c.is_control() => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (body, newline) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, true),
            None => (buf, false),
        };
        let clean = std::str::from_utf8(body).is_ok_and(|s| {
            !s.chars()
                .any(|c| c.is_control() && !(self.keep_ansi && c == '\u{1b}'))
        });
        if clean {
            self.inner.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut out = String::with_capacity(buf.len() + 16);
        escape_into(&mut out, &String::from_utf8_lossy(body), self.keep_ansi);
        if newline {
            out.push('\n');
        }
        self.inner.write_all(out.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(input: &[u8], keep_ansi: bool) -> String {
        let mut w = Escaping::new(Vec::new(), keep_ansi);
        w.write_all(input).unwrap();
        String::from_utf8(w.inner).unwrap()
    }

    #[test]
    fn one_event_stays_one_line() {
        let forged =
            b"WARN model call failed: bad\n2026-12-03T00:00:00Z  INFO forged\0\x1b[2J\xff\n";
        let out = through(forged, false);
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(out.ends_with('\n'));
        assert!(out.contains("bad\\n2026-12-03T00:00:00Z  INFO forged\\0\\u{1b}[2J\u{fffd}"));
        // Clean lines pass unchanged; colours stay on a terminal.
        assert_eq!(through(b"INFO all good\n", false), "INFO all good\n");
        assert_eq!(
            through(b"\x1b[32mINFO\x1b[0m ok\n", true),
            "\x1b[32mINFO\x1b[0m ok\n"
        );
        assert_eq!(through(b"\x1b[32mINFO\n", false), "\\u{1b}[32mINFO\n");
    }
}
