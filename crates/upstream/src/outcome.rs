//! How an upstream exchange ended: the one word the balancers, passive ejection and the
//! breakers share about it, below all three.

/// How an upstream exchange ended, as the balancer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered with this status (any status: the balancer decides what a
    /// 5xx means to it).
    Status(u16),
    /// Connect refused or reset: the request never reached the endpoint.
    ConnectFailed,
    /// Connect or response head timed out.
    Timeout,
    /// The connection broke after the request was sent.
    Broken,
    /// The downstream side ended the exchange (its body broke or went over the limit); this
    /// says nothing about the endpoint.
    Aborted,
}
