//! Network-policy mediation on the request path (after the request hook, before the
//! upstream): the one branch an unrestricted session pays, else the dialect's mediator
//! through [`intercept_core::dialect::mediate_request`], and a log line of what it did.

use intercept_core::dialect::mediate_request;
use intercept_core::network::{NetworkPolicy, PolicyEvent};
use intercept_core::{Dialect, Error, JsonBody};
use tracing::warn;

/// Mediates `body`; see [`mediate_request`].
#[inline]
pub(crate) fn mediate(
    dialect: &dyn Dialect,
    policy: &NetworkPolicy,
    session: &str,
    body: &mut JsonBody,
) -> Result<Option<PolicyEvent>, Error> {
    if !policy.is_restricted() {
        return Ok(None);
    }
    let outcome = mediate_request(dialect, policy, body);
    let dialect = dialect.kind().as_str();
    match &outcome {
        Ok(Some(event)) => {
            warn!(session, dialect, paths = ?event.paths, "network policy removed provider-side capabilities");
        }
        Err(e) => warn!(session, dialect, error = %e, "network policy refused a call"),
        Ok(None) => {}
    }
    outcome
}
