//! The overload metrics as a scrape shows them: values mirrored from the controllers,
//! breakers and balancers into the tailguard-metrics registry at scrape time.

use std::sync::Arc;
use std::time::Duration;

use tailguard_metrics::{Format, Registry};
use tailguard_overload::{
    Breaker, BreakerConfig, Class, Outcome, OverloadMetrics, P2c, P2cConfig, Shedder, ShedderConfig,
};

#[test]
fn a_scrape_shows_shedder_breaker_and_balancer_state() {
    let ms = Duration::from_millis;
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let metrics = OverloadMetrics::register(&registry).unwrap();

    let shedder = Shedder::new(ShedderConfig::adaptive()).unwrap();
    let api = shedder.group("api");
    shedder.tick(ms(0), 0);
    for _ in 0..50 {
        api.admit(ms(0), Class::Normal)
            .unwrap()
            .complete(ms(10), Outcome::Served);
    }
    shedder.tick(ms(100), 950); // C = 5, L = 5 x 0.5 + 1 core = 3.5, hot
    let held: Vec<_> = (0..4)
        .map(|_| api.admit(ms(100), Class::Normal).unwrap())
        .collect();
    assert!(api.admit(ms(100), Class::Low).is_err());
    assert!(api.admit(ms(100), Class::Normal).is_err());
    metrics.watch_shedder(&shedder, None);

    let breaker = Arc::new(Breaker::new("b", BreakerConfig::adaptive()).unwrap());
    metrics.watch_breaker("users", "api", &breaker);
    let p2c = Arc::new(P2c::new(
        vec!["10.0.0.1:80", "10.0.0.2:80"],
        P2cConfig::default(),
    ));
    metrics
        .watch_balancer(
            "users",
            vec!["10.0.0.1:80".into(), "10.0.0.2:80".into()],
            &p2c,
        )
        .unwrap();
    let again = Arc::new(P2c::new(vec!["10.0.0.3:80"], P2cConfig::default()));
    metrics
        .watch_balancer("orders", vec!["10.0.0.3:80".into()], &again)
        .expect("the family is registered once, by the first call");
    drop(p2c.pick(ms(0)));

    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    for line in [
        "tailguard_overload_cpu_usage_ratio 0.95",
        "tailguard_overload_cores 1.0",
        "tailguard_overload_inflight{group=\"api\"} 4",
        "tailguard_overload_limit{group=\"api\"} 3.5",
        "tailguard_overload_capacity{group=\"api\"} 5.0",
        "tailguard_overload_hot{group=\"api\"} 1",
        "tailguard_overload_admitted_total{group=\"api\"} 54.0",
        "tailguard_overload_shed_total{group=\"api\",class=\"low\"} 1.0",
        "tailguard_overload_shed_total{group=\"api\",class=\"normal\"} 1.0",
        "tailguard_overload_shed_total{group=\"api\",class=\"critical\"} 0.0",
        "tailguard_breaker_state{upstream=\"users\",route=\"api\"} 0",
        "tailguard_breaker_rejected_total{upstream=\"users\",route=\"api\"} 0.0",
        "tailguard_balancer_picks_total{upstream=\"users\",endpoint=\"10.0.0.1:80\"} 1.0",
        "tailguard_balancer_picks_total{upstream=\"users\",endpoint=\"10.0.0.2:80\"} 0.0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
    drop(held);

    // A dropped breaker stops being shown as updated (and does not keep anything alive).
    let weak = Arc::downgrade(&breaker);
    drop(breaker);
    let _ = registry.render(Format::Text);
    assert!(weak.upgrade().is_none());
}

#[test]
fn the_balancer_family_is_registered_only_by_a_watch() {
    // A gateway counting picks itself (any balancer) registers the name, never watching.
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let metrics = OverloadMetrics::register(&registry).unwrap();
    registry
        .counter(
            "tailguard_balancer_picks",
            "picks counted by the caller",
            &["upstream", "endpoint"],
        )
        .expect("the name is free");
    let p2c = Arc::new(P2c::new(vec!["a"], P2cConfig::default()));
    assert!(
        metrics.watch_balancer("u", vec!["a".into()], &p2c).is_err(),
        "the name is taken: a clear error, not a second family"
    );
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    assert!(text.contains("# HELP tailguard_balancer_picks_total picks counted by the caller"));
}
