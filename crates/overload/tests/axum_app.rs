//! The axum example's app (`examples/axum/app.rs`, the same file) on 127.0.0.1:0, overloaded
//! deterministically (a fake clock, the CPU reading injected through `tick`, in-flight
//! requests held), and the per-request-clone trap of route-level layers in axum.

#[path = "../examples/axum/app.rs"]
mod app;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use tailguard_overload::{
    Class, Controller, FakeClock, Outcome, Rejected, Shed, ShedderConfig, ShedderLayer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Sends one request on a connection of its own.
async fn send(addr: SocketAddr, method: &str, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s
}

/// Reads the response to the end; lower-cased.
async fn response(mut s: TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("a response within 10 s")
        .unwrap();
    String::from_utf8(out).unwrap().to_ascii_lowercase()
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> String {
    response(send(addr, method, path).await).await
}

/// The API group after 50 requests of 10 ms in a bucket (capacity C = 5) and a tick with
/// the CPU at 95 % of one core: hot, limit L = 5 x 0.5 + 1 = 3.5.
fn hot_api(clock: &FakeClock) -> Arc<Controller> {
    let ms = Duration::from_millis;
    let api = Arc::new(Controller::new("api", ShedderConfig::adaptive()).unwrap());
    api.tick(ms(0), 0);
    for _ in 0..50 {
        api.admit(ms(0), Class::Normal)
            .unwrap()
            .complete(ms(10), Outcome::Served);
    }
    api.tick(ms(100), 950);
    clock.set(ms(100));
    api
}

#[tokio::test]
async fn example_app_sheds_api_routes_with_retry_after_while_critical_and_health_answer() {
    let clock = FakeClock::default();
    let api = hot_api(&clock);
    let addr = serve(app::app(api.clone(), clock.clone())).await;

    // Cold in-flight: the API answers even though the CPU is hot.
    assert!(
        request(addr, "GET", "/users/1")
            .await
            .starts_with("http/1.1 200")
    );

    // Four requests of the group in flight (above L = 3.5): the API routes shed.
    let held: Vec<_> = (0..4)
        .map(|_| {
            api.admit(Duration::from_millis(100), Class::Critical)
                .unwrap()
        })
        .collect();
    for path in ["/users/1", "/"] {
        let res = request(addr, "GET", path).await;
        assert!(res.starts_with("http/1.1 503"), "{path}: {res}");
        assert!(
            res.contains("\r\nretry-after: 1\r\n") || res.contains("\r\nretry-after: 2\r\n"),
            "{res}"
        );
    }
    // The critical route is admitted (and counted) by the same controller.
    let res = request(addr, "POST", "/checkout").await;
    assert!(res.starts_with("http/1.1 200"), "{res}");
    assert!(res.ends_with("order placed\n"), "{res}");
    // Health checks never meet the shedder.
    assert!(
        request(addr, "GET", "/healthz")
            .await
            .starts_with("http/1.1 200")
    );

    let snapshot = api.snapshot(Duration::from_millis(100));
    assert_eq!(snapshot.shed[Class::Normal.index()], 2);
    assert_eq!(snapshot.shed[Class::Critical.index()], 0);

    // The load gone, the API answers again.
    drop(held);
    assert!(
        request(addr, "GET", "/users/2")
            .await
            .starts_with("http/1.1 200")
    );
}

/// At most one request in flight, a limiter written as the crate's `Shed` policy, with its
/// count in one of two places.
trait Count: Clone + Send + Sync + 'static {
    fn count(&self) -> &AtomicUsize;
}

/// The wrong way: the count is a field of the value. Cloning copies it, and axum clones a
/// route's service (and the policy in it) for every request.
struct CountInClone(AtomicUsize);

impl Clone for CountInClone {
    fn clone(&self) -> Self {
        Self(AtomicUsize::new(self.0.load(Ordering::SeqCst)))
    }
}

impl Count for CountInClone {
    fn count(&self) -> &AtomicUsize {
        &self.0
    }
}

/// The right way: the count behind an `Arc` every clone shares (as `Arc<Controller>`).
#[derive(Clone)]
struct CountShared(Arc<AtomicUsize>);

impl Count for CountShared {
    fn count(&self) -> &AtomicUsize {
        &self.0
    }
}

#[derive(Clone)]
struct AtMostOne<T>(T);

impl<T: Count> Shed for AtMostOne<T> {
    type Permit = ();
    fn admit(&self, _: Duration, class: Class) -> Result<(), Rejected> {
        if self.0.count().fetch_add(1, Ordering::SeqCst) < 1 {
            return Ok(());
        }
        self.0.count().fetch_sub(1, Ordering::SeqCst);
        Err(Rejected {
            class,
            severe: false,
        })
    }
    fn complete(&self, _: (), _: Duration, _: Outcome) {
        self.0.count().fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Gate {
    entered: Arc<AtomicUsize>,
    release: Arc<Semaphore>,
}

/// A route whose handler waits for the gate, behind a route-level shedder with `policy`.
fn held_route<S: Shed>(policy: S, gate: Gate) -> Router {
    Router::new()
        .route(
            "/hold",
            get(|State(gate): State<Gate>| async move {
                gate.entered.fetch_add(1, Ordering::SeqCst);
                gate.release.acquire().await.unwrap().forget();
                "done\n"
            })
            .layer(ShedderLayer::with_policy(policy)),
        )
        .with_state(gate)
}

async fn wait_entered(gate: &Gate, n: usize) {
    for _ in 0..1000 {
        if gate.entered.load(Ordering::SeqCst) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} requests never reached the handler");
}

/// Sends a request while another holds the route; returns the second one's status line
/// and how many requests reached the handler.
async fn second_request_while_first_held<S: Shed>(policy: S) -> (String, usize) {
    let gate = Gate {
        entered: Arc::default(),
        release: Arc::new(Semaphore::new(0)),
    };
    let addr = serve(held_route(policy, gate.clone())).await;
    let first = send(addr, "GET", "/hold").await;
    wait_entered(&gate, 1).await;
    let second = send(addr, "GET", "/hold").await;
    // Either the shedder answers at once, or the request reaches the handler and waits.
    let second = tokio::select! {
        res = response(second) => Some(res),
        () = wait_entered(&gate, 2) => None,
    };
    let entered = gate.entered.load(Ordering::SeqCst);
    gate.release.add_permits(2);
    assert!(response(first).await.starts_with("http/1.1 200"));
    let status = match second {
        Some(res) => res,
        None => "admitted".to_owned(),
    };
    (status.lines().next().unwrap_or("").to_owned(), entered)
}

#[tokio::test]
async fn route_level_limiter_with_state_in_the_clone_enforces_nothing_in_axum() {
    let (second, entered) =
        second_request_while_first_held(AtMostOne(CountInClone(AtomicUsize::new(0)))).await;
    assert_eq!(
        second, "admitted",
        "the copy in the clone was expected to lose the count"
    );
    assert_eq!(
        entered, 2,
        "both requests reached the handler: the limit of 1 was lost"
    );
}

#[tokio::test]
async fn route_level_limiter_with_state_behind_an_arc_keeps_it_across_requests() {
    let count = Arc::new(AtomicUsize::new(0));
    let (second, entered) =
        second_request_while_first_held(AtMostOne(CountShared(count.clone()))).await;
    assert_eq!(second, "http/1.1 503 service unavailable");
    assert_eq!(entered, 1);
    // Both requests ended: the shared count is back to 0.
    for _ in 0..1000 {
        if count.load(Ordering::SeqCst) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("in-flight count never returned to 0");
}
