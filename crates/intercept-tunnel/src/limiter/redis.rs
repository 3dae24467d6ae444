//! The Redis backend of the rate limiter: the window of one account is a Redis hash
//! (`<start id> → "<start ms> <end ms or ->"`), changed only by two Lua scripts, so a
//! reservation is atomic across every host that shares the server.
//!
//! "Now" is the Redis server's `TIME`, never a host's clock. Every round trip (connecting
//! included) is bounded by the configured timeout; past it, or on any error, the call
//! fails closed with [`TunnelError::LimiterUnavailable`] and the cached connection is
//! dropped, so the next call reconnects.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script};

use super::{redact_url, Params, Reserved};
use crate::error::TunnelError;

/// Reserves a start: prunes entries that no longer count, decides like the file
/// backend's `schedule`, and records the start in flight. Returns `{0}` when the whole
/// budget is in flight, `{1, at, wait}` for a slot, `{2, wait}` when the slot is further
/// away than the caller's budget (recording nothing).
const RESERVE: &str = r"
local key = KEYS[1]
local window = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local horizon = tonumber(ARGV[5])
local id = ARGV[6]
local ttl = tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fields = redis.call('HGETALL', key)
local ends = {}
local in_flight = 0
for i = 1, #fields, 2 do
  local field, value = fields[i], fields[i + 1]
  local s, e = string.match(value, '^(%d+) ([%d%-]+)$')
  local start = tonumber(s)
  local finish = nil
  local keep = start ~= nil and start <= now + horizon
  if keep and e ~= '-' then
    finish = tonumber(e)
    if finish == nil then keep = false end
  end
  if keep and finish == nil and start + lease < now then
    finish = start + lease
    redis.call('HSET', key, field, string.format('%d %d', start, finish))
  end
  if keep and finish ~= nil and finish + window <= now then keep = false end
  if not keep then
    redis.call('HDEL', key, field)
  elseif finish == nil then
    in_flight = in_flight + 1
  else
    ends[#ends + 1] = finish
  end
end
if in_flight >= rate then return {0} end
local at = now
local n = in_flight + #ends
if n >= rate then
  table.sort(ends)
  at = math.max(now, ends[n - rate + 1] + window)
end
local wait = at - now
if wait > budget then return {2, wait} end
redis.call('HSET', key, id, string.format('%d -', at))
redis.call('PEXPIRE', key, ttl)
return {1, at, wait}
";

/// Marks a start ended at now + margin (never before its start). Returns 1 when the
/// start was still recorded.
const COMPLETE: &str = r"
local key = KEYS[1]
local value = redis.call('HGET', key, ARGV[1])
if not value then return 0 end
local start = tonumber(string.match(value, '^(%d+) '))
if start == nil then
  redis.call('HDEL', key, ARGV[1])
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local finish = math.max(now + tonumber(ARGV[2]), start)
redis.call('HSET', key, ARGV[1], string.format('%d %d', start, finish))
redis.call('PEXPIRE', key, tonumber(ARGV[3]))
return 1
";

/// Limiter calls that failed closed because Redis could not be used, process-wide.
static UNAVAILABLE: AtomicU64 = AtomicU64::new(0);

/// How many limiter calls failed closed because the Redis backend could not be reached or
/// did not answer in time, in this process. The sidecar exports it as
/// `intercept_tunnel_limiter_unavailable_total`.
pub fn limiter_unavailable_total() -> u64 {
    UNAVAILABLE.load(Ordering::Relaxed)
}

/// One account's window in a Redis server.
pub(crate) struct RedisWindow {
    client: Client,
    /// The URL with its password hidden, for messages.
    shown: String,
    key: String,
    timeout: Duration,
    connection: Mutex<Option<MultiplexedConnection>>,
    reserve: Script,
    complete: Script,
    /// Whether the last call failed: one warning when Redis goes away, one line when it
    /// is back.
    down: AtomicBool,
}

impl fmt::Debug for RedisWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisWindow")
            .field("url", &self.shown)
            .field("key", &self.key)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisWindow {
    /// A window at `url` under `key`; connects on first use.
    pub(crate) fn new(url: &str, key: String, timeout: Duration) -> Result<Self, TunnelError> {
        let shown = redact_url(url);
        let client = Client::open(url).map_err(|e| {
            TunnelError::Config(format!(
                "tunnel rate limiter: cannot use Redis URL {shown}: {e} (expected \
                 redis://[user:password@]host[:port][/db])"
            ))
        })?;
        Ok(RedisWindow {
            client,
            shown,
            key,
            timeout,
            connection: Mutex::new(None),
            reserve: Script::new(RESERVE),
            complete: Script::new(COMPLETE),
            down: AtomicBool::new(false),
        })
    }

    /// Reserves one start (see [`RESERVE`]).
    pub(crate) async fn reserve(
        &self,
        p: Params,
        bound: Duration,
    ) -> Result<Reserved, TunnelError> {
        let id = fastrand::u64(1..);
        let mut invocation = self.reserve.key(&self.key);
        invocation
            .arg(p.window_ms)
            .arg(p.rate)
            .arg(p.lease_ms)
            .arg(p.budget_ms)
            .arg(p.horizon_ms)
            .arg(id)
            .arg(p.ttl_ms());
        let reply: Vec<u64> = self
            .call("reserve a start", |mut conn| async move {
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        match reply.as_slice() {
            [0] => Ok(Reserved::Blocked),
            [1, at_ms, wait] => Ok(Reserved::At {
                id,
                at_ms: *at_ms,
                wait: Duration::from_millis(*wait),
            }),
            [2, wait] => Err(TunnelError::RateLimited {
                wait: Duration::from_millis(*wait),
                bound,
            }),
            other => Err(self.unavailable(&format!(
                "its reservation script answered {other:?}, not a reservation"
            ))),
        }
    }

    /// Marks start `id` ended (see [`COMPLETE`]).
    pub(crate) async fn complete(&self, id: u64, p: Params) -> Result<(), TunnelError> {
        let mut invocation = self.complete.key(&self.key);
        invocation.arg(id).arg(p.margin_ms).arg(p.ttl_ms());
        let _: u64 = self
            .call("record a completed start", |mut conn| async move {
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        Ok(())
    }

    /// Runs one round trip on the cached connection (connecting first if there is none),
    /// the whole of it within the timeout. Any failure drops the connection and fails
    /// closed.
    async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, TunnelError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async {
            let cached = self.cached();
            let conn = match cached {
                Some(conn) => conn,
                None => {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(self.timeout)
                        .set_response_timeout(self.timeout);
                    let conn = self
                        .client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?;
                    if let Ok(mut slot) = self.connection.lock() {
                        *slot = Some(conn.clone());
                    }
                    conn
                }
            };
            f(conn).await
        };
        let silent = || {
            format!(
                "did not answer within {:?} (while trying to {what})",
                self.timeout
            )
        };
        let outcome = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if e.is_timeout() => Err(silent()),
            Ok(Err(e)) => Err(format!("could not {what}: {e}")),
            Err(_) => Err(silent()),
        };
        match outcome {
            Ok(value) => {
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(redis = %self.shown, "tunnel rate limiter: Redis answers again");
                }
                Ok(value)
            }
            Err(why) => {
                if let Ok(mut slot) = self.connection.lock() {
                    *slot = None;
                }
                Err(self.unavailable(&why))
            }
        }
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.connection.lock().ok().and_then(|c| c.clone())
    }

    /// The fail-closed error, counted, and logged once per outage.
    fn unavailable(&self, why: &str) -> TunnelError {
        UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
        let message = format!(
            "tunnel rate limiter: Redis at {} {why}; no tunnel is started while the shared \
             budget cannot be checked (check that Redis runs and is reachable, or use the \
             host-wide file limiter)",
            self.shown
        );
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(redis = %self.shown, error = %message, "tunnel rate limiter: Redis unavailable; failing closed");
        }
        TunnelError::LimiterUnavailable(message)
    }
}
