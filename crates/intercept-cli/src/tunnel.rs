//! Tunnel configuration as the sidecar uses it: the tunnel crate's [`TunnelConfig`] with
//! every tunnel it makes counting its starts and failed starts, for `/metrics`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use intercept_core::{BindAddr, Endpoint, Error, Tunnel};
use intercept_pool::TunnelSpec;
use intercept_tunnel::TunnelConfig;

/// Tunnel starts (`expose` calls) of every tunnel a [`CountedTunnels`] made.
#[derive(Debug, Default)]
pub(crate) struct TunnelCounters {
    starts: AtomicU64,
    failures: AtomicU64,
}

impl TunnelCounters {
    /// Tunnels that came up.
    pub(crate) fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Tunnel starts that failed.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// A [`TunnelConfig`] whose tunnels count their starts into shared counters.
#[derive(Debug, Clone)]
pub(crate) struct CountedTunnels {
    pub(crate) config: TunnelConfig,
    pub(crate) counters: Arc<TunnelCounters>,
}

impl TunnelSpec for CountedTunnels {
    fn is_none(&self) -> bool {
        TunnelSpec::is_none(&self.config)
    }

    fn make(&self) -> Result<Arc<dyn Tunnel>, Error> {
        Ok(Arc::new(Counted {
            inner: self.config.make()?,
            counters: self.counters.clone(),
        }))
    }
}

/// One tunnel, counting.
struct Counted {
    inner: Arc<dyn Tunnel>,
    counters: Arc<TunnelCounters>,
}

impl fmt::Debug for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counted")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Tunnel for Counted {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn bind_addr(&self) -> BindAddr {
        self.inner.bind_addr()
    }

    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error> {
        let result = self.inner.expose(port).await;
        let counter = match &result {
            Ok(_) => &self.counters.starts,
            Err(_) => &self.counters.failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }
}
