//! A route's authentication ([`Gate`]): its authenticators in the order written, tried until
//! one accepts; the client's copies of every header they set removed first; one count per
//! request, for the authenticator that decided.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, Uri};

use crate::authenticate::{AuthRequest, Authenticate};
use crate::metrics::ResultCounters;
use crate::outcome::{Accepted, Outcome, PendingOutcome, Refusal, Verdict};
use crate::result::AuthResult;
use crate::source::Source;

/// One authenticator as a route names it.
#[derive(Debug)]
struct Member {
    name: Arc<str>,
    auth: Arc<dyn Authenticate>,
    counters: ResultCounters,
}

/// The authentication of one route: `auth = "a"` or `auth = ["a", "b"]`, where any one that
/// accepts lets the request through. Built once per config, shared by the serving threads.
#[derive(Debug)]
pub struct Gate {
    members: Box<[Member]>,
    /// Every header a member sets, removed from the client's request before any runs.
    sets: Box<[HeaderName]>,
    /// Query parameters a member reads a credential from.
    query: Box<[Source]>,
}

/// How a request's authentication ended.
#[derive(Debug)]
pub enum Decision {
    /// Let through by the authenticator named `auth`.
    Accepted {
        /// Who called and what changes on the request sent upstream.
        accepted: Accepted,
        /// The authenticator that accepted.
        auth: Arc<str>,
    },
    /// Answered with the refusal of the authenticator named `auth`.
    Refused {
        /// The answer.
        refusal: Refusal,
        /// The authenticator whose refusal it is.
        auth: Arc<str>,
    },
}

impl Decision {
    /// The result, for the access log's `$auth_result`.
    pub fn result(&self) -> AuthResult {
        match self {
            Decision::Accepted { .. } => AuthResult::Ok,
            Decision::Refused { refusal, .. } => refusal.result,
        }
    }
}

/// A route's check: decided on the spot, or a future to await.
#[derive(Debug)]
pub enum Check<'a> {
    /// Decided.
    Ready(Decision),
    /// One of the authenticators answered later; await it.
    Pending(PendingCheck<'a>),
}

impl Gate {
    /// A gate of `members` (name, authenticator, its counters on this route), in order.
    pub fn new(
        members: impl IntoIterator<Item = (Arc<str>, Arc<dyn Authenticate>, ResultCounters)>,
    ) -> Gate {
        let members: Box<[Member]> = members
            .into_iter()
            .map(|(name, auth, counters)| Member {
                name,
                auth,
                counters,
            })
            .collect();
        let mut sets: Vec<HeaderName> = Vec::new();
        for m in &members {
            for h in m.auth.sets_headers() {
                if !sets.contains(h) {
                    sets.push(h.clone());
                }
            }
        }
        let mut query: Vec<Source> = Vec::new();
        for m in &members {
            for s in m.auth.sources() {
                if matches!(s, Source::Query(_)) && !query.contains(s) {
                    query.push(s.clone());
                }
            }
        }
        Gate {
            members,
            sets: sets.into_boxed_slice(),
            query: query.into_boxed_slice(),
        }
    }

    /// Removes the client's copies of every header an authenticator of this route sets:
    /// called before [`Gate::check`], so a client can never pass one off as the gateway's.
    pub fn remove_client_copies(&self, headers: &mut HeaderMap) {
        for h in &self.sets {
            headers.remove(h);
        }
    }

    /// The target without the query parameters a member reads credentials from, for the
    /// access log (a key or token is never written to a log); `None` when there is nothing
    /// to take out.
    pub fn redact(&self, uri: &Uri) -> Option<Uri> {
        uri.query()?;
        let empty = HeaderMap::new();
        if !self.query.iter().any(|s| s.find(uri, &empty).is_some()) {
            return None;
        }
        let mut out = uri.clone();
        let mut headers = HeaderMap::new();
        for s in &self.query {
            s.remove(&mut out, &mut headers);
        }
        Some(out)
    }

    /// Checks a request: each authenticator in order until one accepts.
    pub fn check<'a>(&'a self, req: AuthRequest<'a>) -> Check<'a> {
        match self.run(&req, 0, None) {
            Step::Done(d) => Check::Ready(d),
            Step::Wait {
                member,
                pending,
                best,
            } => Check::Pending(PendingCheck {
                gate: self,
                req,
                member,
                pending,
                best,
            }),
        }
    }

    /// [`Gate::check`] as one future (the tower layer's form).
    pub async fn decide(&self, req: AuthRequest<'_>) -> Decision {
        match self.check(req) {
            Check::Ready(d) => d,
            Check::Pending(p) => p.await,
        }
    }

    /// Runs members from `start` on, with the refusal kept so far.
    fn run(&self, req: &AuthRequest<'_>, start: usize, mut best: Best) -> Step {
        for (i, m) in self.members.iter().enumerate().skip(start) {
            match m.auth.check(req) {
                Verdict::Ready(outcome) => {
                    if let Some(d) = self.settle(i, outcome, &mut best) {
                        return Step::Done(d);
                    }
                }
                Verdict::Pending(pending) => {
                    return Step::Wait {
                        member: i,
                        pending,
                        best,
                    };
                }
            }
        }
        Step::Done(self.refuse(best))
    }

    /// An accepted outcome decides; a refusal is kept if it is the one to answer with.
    fn settle(&self, i: usize, outcome: Outcome, best: &mut Best) -> Option<Decision> {
        match outcome {
            Outcome::Accepted(accepted) => {
                let m = &self.members[i];
                m.counters.inc(AuthResult::Ok);
                Some(Decision::Accepted {
                    accepted,
                    auth: Arc::clone(&m.name),
                })
            }
            Outcome::Refused(refusal) => {
                // The answer is the first refusal of a presented credential ("your token
                // expired" says more than "no API key"); when none was presented, the
                // first authenticator's.
                let better = match best {
                    None => true,
                    Some((_, r)) => {
                        r.result == AuthResult::Missing && refusal.result != AuthResult::Missing
                    }
                };
                if better {
                    *best = Some((i, refusal));
                }
                None
            }
        }
    }

    fn refuse(&self, best: Best) -> Decision {
        match best {
            Some((i, refusal)) => {
                let m = &self.members[i];
                m.counters.inc(refusal.result);
                Decision::Refused {
                    refusal,
                    auth: Arc::clone(&m.name),
                }
            }
            // A gate without members is never built (a route's `auth` list is checked to
            // be non-empty); refuse rather than let through if it were.
            None => Decision::Refused {
                refusal: Refusal::text(AuthResult::Refused, http::StatusCode::FORBIDDEN),
                auth: Arc::from(""),
            },
        }
    }
}

type Best = Option<(usize, Refusal)>;

enum Step {
    Done(Decision),
    Wait {
        member: usize,
        pending: PendingOutcome,
        best: Best,
    },
}

/// The rest of a route's check once an authenticator answered later.
pub struct PendingCheck<'a> {
    gate: &'a Gate,
    req: AuthRequest<'a>,
    member: usize,
    pending: PendingOutcome,
    best: Best,
}

impl std::fmt::Debug for PendingCheck<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingCheck")
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl Future for PendingCheck<'_> {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        let this = self.get_mut();
        loop {
            let outcome = match this.pending.as_mut().poll(cx) {
                Poll::Ready(o) => o,
                Poll::Pending => return Poll::Pending,
            };
            let mut best = this.best.take();
            if let Some(d) = this.gate.settle(this.member, outcome, &mut best) {
                return Poll::Ready(d);
            }
            match this.gate.run(&this.req, this.member + 1, best) {
                Step::Done(d) => return Poll::Ready(d),
                Step::Wait {
                    member,
                    pending,
                    best,
                } => {
                    this.member = member;
                    this.pending = pending;
                    this.best = best;
                }
            }
        }
    }
}
