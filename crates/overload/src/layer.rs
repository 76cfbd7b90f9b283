//! Tower middleware: [`ShedderLayer`] and [`BreakerLayer`] give any hyper/axum service the
//! gateway's protection, with no-op implementations ([`NoopShedder`], [`NoopBreaker`]) when
//! disabled instead of `if enabled` branches.
//!
//! A shed request gets `503 Service Unavailable`, `Retry-After: 1` or `2` (jittered so
//! rejected clients do not return in lockstep), `x-overloaded: 1`, and `Connection: close`
//! when in-flight is above twice the limit; its body is never read. The response carries an
//! [`Overloaded`] extension so an outer [`BreakerLayer`] forgets it instead of counting a
//! failure (layer-1 rejections never count against an upstream).
//!
//! State lives behind the `Arc` the layer holds, never in the per-request service clone:
//! axum clones route services per request, and a limiter whose state lives in the clone
//! enforces nothing (axum #2582).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::{Breaker, BreakerOpen, OwnedBreakerPermit, failure_status};
use crate::class::{Class, Rejected};
use crate::shedder::{Controller, Outcome, OwnedPermit};
use crate::{Clock, MonotonicClock};

/// Marks a response produced by the shedder itself (a layer-1 rejection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded;

/// Admission policy behind [`ShedderLayer`].
pub trait Shed: Clone + Send + Sync + 'static {
    /// Held while the request runs.
    type Permit: Send + 'static;
    /// Admits or rejects.
    fn admit(&self, now: Duration, class: Class) -> Result<Self::Permit, Rejected>;
    /// Ends an admitted request.
    fn complete(&self, permit: Self::Permit, now: Duration, outcome: Outcome);
}

impl Shed for Arc<Controller> {
    type Permit = OwnedPermit;
    #[inline]
    fn admit(&self, now: Duration, class: Class) -> Result<OwnedPermit, Rejected> {
        self.admit_owned(now, class)
    }
    #[inline]
    fn complete(&self, permit: OwnedPermit, now: Duration, outcome: Outcome) {
        permit.complete(now, outcome);
    }
}

/// Shedding disabled: admits everything, records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopShedder;

impl Shed for NoopShedder {
    type Permit = ();
    #[inline]
    fn admit(&self, _: Duration, _: Class) -> Result<(), Rejected> {
        Ok(())
    }
    #[inline]
    fn complete(&self, _: (), _: Duration, _: Outcome) {}
}

/// Breaking policy behind [`BreakerLayer`].
pub trait Trip: Clone + Send + Sync + 'static {
    /// Held while the request runs.
    type Permit: Send + 'static;
    /// Dispatches or refuses.
    fn allow(&self, now: Duration) -> Result<Self::Permit, BreakerOpen>;
    /// Ends a dispatched request: `Some(true)` success, `Some(false)` failure, `None` forget.
    fn finish(&self, permit: Self::Permit, now: Duration, result: Option<bool>);
}

impl Trip for Arc<Breaker> {
    type Permit = OwnedBreakerPermit;
    fn allow(&self, now: Duration) -> Result<OwnedBreakerPermit, BreakerOpen> {
        Ok(Breaker::allow(self, now)?.into_owned(self))
    }
    fn finish(&self, permit: OwnedBreakerPermit, now: Duration, result: Option<bool>) {
        match result {
            Some(true) => permit.success(now),
            Some(false) => permit.failure(now),
            None => drop(permit),
        }
    }
}

/// Breaking disabled.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopBreaker;

impl Trip for NoopBreaker {
    type Permit = ();
    fn allow(&self, _: Duration) -> Result<(), BreakerOpen> {
        Ok(())
    }
    fn finish(&self, _: (), _: Duration, _: Option<bool>) {}
}

/// The 503 a shed (or broken) request gets; `B::default()` is the empty body.
pub fn overloaded_response<B: Default>(severe: bool) -> Response<B> {
    let mut res = Response::new(B::default());
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = res.headers_mut();
    h.insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(if fastrand::bool() { "1" } else { "2" }),
    );
    h.insert("x-overloaded", HeaderValue::from_static("1"));
    if severe {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    res.extensions_mut().insert(Overloaded);
    res
}

/// Applies a [`Shed`] policy to a service. The request's class is its `Class` extension if
/// any, else the layer's class.
#[derive(Debug, Clone)]
pub struct ShedderLayer<S = Arc<Controller>, C = MonotonicClock> {
    shed: S,
    clock: C,
    class: Class,
}

impl ShedderLayer {
    /// Sheds with `controller` on the real clock, class [`Class::Normal`].
    pub fn new(controller: Arc<Controller>) -> Self {
        Self {
            shed: controller,
            clock: MonotonicClock,
            class: Class::Normal,
        }
    }
}

impl ShedderLayer<NoopShedder> {
    /// A layer that sheds nothing.
    pub fn disabled() -> Self {
        Self {
            shed: NoopShedder,
            clock: MonotonicClock,
            class: Class::Normal,
        }
    }
}

impl<S: Shed> ShedderLayer<S> {
    /// Sheds with any [`Shed`] policy on the real clock, class [`Class::Normal`]. The policy
    /// is cloned into the service of every route the layer wraps, and axum clones a route's
    /// service again for every request: its state must live behind an `Arc` the clones
    /// share (as `Arc<Controller>`'s does), or each request sees a fresh copy.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::time::Duration;
    /// use tailguard_overload::{Class, Outcome, Rejected, Shed, ShedderLayer};
    ///
    /// /// At most `max` requests in flight; the count is shared by every clone.
    /// #[derive(Clone)]
    /// struct AtMost { in_flight: Arc<AtomicUsize>, max: usize }
    ///
    /// impl Shed for AtMost {
    ///     type Permit = ();
    ///     fn admit(&self, _: Duration, class: Class) -> Result<(), Rejected> {
    ///         if self.in_flight.fetch_add(1, Ordering::Relaxed) < self.max {
    ///             return Ok(());
    ///         }
    ///         self.in_flight.fetch_sub(1, Ordering::Relaxed);
    ///         Err(Rejected { class, severe: false })
    ///     }
    ///     fn complete(&self, _: (), _: Duration, _: Outcome) {
    ///         self.in_flight.fetch_sub(1, Ordering::Relaxed);
    ///     }
    /// }
    ///
    /// let policy = AtMost { in_flight: Arc::default(), max: 1 };
    /// let _layer = ShedderLayer::with_policy(policy.clone());
    /// let first = policy.clone().admit(Duration::ZERO, Class::Normal);
    /// assert!(first.is_ok());
    /// assert!(policy.admit(Duration::ZERO, Class::Normal).is_err()); // the clone saw it
    /// ```
    pub fn with_policy(shed: S) -> Self {
        Self {
            shed,
            clock: MonotonicClock,
            class: Class::Normal,
        }
    }
}

impl<S, C> ShedderLayer<S, C> {
    /// Default class of requests through this layer.
    pub fn class(mut self, class: Class) -> Self {
        self.class = class;
        self
    }

    /// Uses another clock (tests).
    pub fn clock<C2>(self, clock: C2) -> ShedderLayer<S, C2> {
        ShedderLayer {
            shed: self.shed,
            clock,
            class: self.class,
        }
    }
}

impl<I, S: Clone, C: Clone> Layer<I> for ShedderLayer<S, C> {
    type Service = ShedderService<I, S, C>;
    fn layer(&self, inner: I) -> Self::Service {
        ShedderService {
            inner,
            shed: self.shed.clone(),
            clock: self.clock.clone(),
            class: self.class,
        }
    }
}

/// The service made by [`ShedderLayer`].
#[derive(Debug, Clone)]
pub struct ShedderService<I, S, C> {
    inner: I,
    shed: S,
    clock: C,
    class: Class,
}

impl<I, S, C, B, RB> Service<Request<B>> for ShedderService<I, S, C>
where
    I: Service<Request<B>, Response = Response<RB>>,
    S: Shed,
    C: Clock + Clone,
    RB: Default,
{
    type Response = Response<RB>;
    type Error = I::Error;
    type Future = ShedFuture<I::Future, S, C, Response<RB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let class = req
            .extensions()
            .get::<Class>()
            .copied()
            .unwrap_or(self.class);
        match self.shed.admit(self.clock.now(), class) {
            Ok(permit) => ShedFuture {
                state: ShedState::Admitted {
                    fut: self.inner.call(req),
                    permit: Some(permit),
                    shed: self.shed.clone(),
                    clock: self.clock.clone(),
                },
            },
            // The request (and its unread body) is dropped here.
            Err(r) => ShedFuture {
                state: ShedState::Rejected {
                    response: Some(overloaded_response(r.severe)),
                },
            },
        }
    }
}

pin_project! {
    /// Future of [`ShedderService`].
    pub struct ShedFuture<F, S: Shed, C, R> {
        #[pin]
        state: ShedState<F, S::Permit, S, C, R>,
    }
}

pin_project! {
    #[project = ShedProj]
    enum ShedState<F, P, S, C, R> {
        Admitted { #[pin] fut: F, permit: Option<P>, shed: S, clock: C },
        Rejected { response: Option<R> },
    }
}

impl<F, S, C, R, E> Future for ShedFuture<F, S, C, R>
where
    F: Future<Output = Result<R, E>>,
    S: Shed,
    C: Clock,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            ShedProj::Admitted {
                fut,
                permit,
                shed,
                clock,
            } => {
                let out = std::task::ready!(fut.poll(cx));
                if let Some(p) = permit.take() {
                    let outcome = if out.is_ok() {
                        Outcome::Served
                    } else {
                        Outcome::Failed
                    };
                    shed.complete(p, clock.now(), outcome);
                }
                Poll::Ready(out)
            }
            ShedProj::Rejected { response } => Poll::Ready(Ok(response
                .take()
                .expect("ShedFuture polled after completion"))),
        }
    }
}

/// Applies a [`Trip`] policy (an adaptive breaker) to a client-side service.
#[derive(Debug, Clone)]
pub struct BreakerLayer<T = Arc<Breaker>, C = MonotonicClock> {
    trip: T,
    clock: C,
}

impl BreakerLayer {
    /// Breaks with `breaker` on the real clock.
    pub fn new(breaker: Arc<Breaker>) -> Self {
        Self {
            trip: breaker,
            clock: MonotonicClock,
        }
    }
}

impl BreakerLayer<NoopBreaker> {
    /// A layer that never breaks.
    pub fn disabled() -> Self {
        Self {
            trip: NoopBreaker,
            clock: MonotonicClock,
        }
    }
}

impl<T, C> BreakerLayer<T, C> {
    /// Uses another clock (tests).
    pub fn clock<C2>(self, clock: C2) -> BreakerLayer<T, C2> {
        BreakerLayer {
            trip: self.trip,
            clock,
        }
    }
}

impl<I, T: Clone, C: Clone> Layer<I> for BreakerLayer<T, C> {
    type Service = BreakerService<I, T, C>;
    fn layer(&self, inner: I) -> Self::Service {
        BreakerService {
            inner,
            trip: self.trip.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// The service made by [`BreakerLayer`].
#[derive(Debug, Clone)]
pub struct BreakerService<I, T, C> {
    inner: I,
    trip: T,
    clock: C,
}

impl<I, T, C, B, RB> Service<Request<B>> for BreakerService<I, T, C>
where
    I: Service<Request<B>, Response = Response<RB>>,
    T: Trip,
    C: Clock + Clone,
    RB: Default,
{
    type Response = Response<RB>;
    type Error = I::Error;
    type Future = BreakerFuture<I::Future, T, C, Response<RB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match self.trip.allow(self.clock.now()) {
            Ok(permit) => BreakerFuture {
                state: BreakerFutState::Dispatched {
                    fut: self.inner.call(req),
                    permit: Some(permit),
                    trip: self.trip.clone(),
                    clock: self.clock.clone(),
                },
            },
            Err(BreakerOpen) => {
                let mut res = overloaded_response::<RB>(false);
                res.extensions_mut().remove::<Overloaded>();
                BreakerFuture {
                    state: BreakerFutState::Open {
                        response: Some(res),
                    },
                }
            }
        }
    }
}

pin_project! {
    /// Future of [`BreakerService`].
    pub struct BreakerFuture<F, T: Trip, C, R> {
        #[pin]
        state: BreakerFutState<F, T::Permit, T, C, R>,
    }
}

pin_project! {
    #[project = BreakerProj]
    enum BreakerFutState<F, P, T, C, R> {
        Dispatched { #[pin] fut: F, permit: Option<P>, trip: T, clock: C },
        Open { response: Option<R> },
    }
}

impl<F, T, C, RB, E> Future for BreakerFuture<F, T, C, Response<RB>>
where
    F: Future<Output = Result<Response<RB>, E>>,
    T: Trip,
    C: Clock,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            BreakerProj::Dispatched {
                fut,
                permit,
                trip,
                clock,
            } => {
                let out = std::task::ready!(fut.poll(cx));
                if let Some(p) = permit.take() {
                    let result = match &out {
                        // Our own shedder's 503 says nothing about the upstream.
                        Ok(res) if res.extensions().get::<Overloaded>().is_some() => None,
                        Ok(res) => Some(!failure_status(res.status().as_u16())),
                        Err(_) => Some(false),
                    };
                    trip.finish(p, clock.now(), result);
                }
                Poll::Ready(out)
            }
            BreakerProj::Open { response } => Poll::Ready(Ok(response
                .take()
                .expect("BreakerFuture polled after completion"))),
        }
    }
}
