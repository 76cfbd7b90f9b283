//! Property tests of the controller: the limit stays within its bounds, critical traffic is
//! always admitted, priority is monotone, nothing is shed while cold, in-flight never goes
//! negative and always equals the permits held.

use std::time::Duration;

use proptest::prelude::*;
use tailguard_overload::{Class, Controller, Outcome, Permit, ShedderConfig};

#[derive(Debug, Clone)]
enum Op {
    Admit(Class),
    Complete {
        index: usize,
        rt_us: u64,
        served: bool,
    },
    Drop(usize),
    Tick {
        cpu: u32,
    },
    Advance(u64),
}

fn class() -> impl Strategy<Value = Class> {
    prop_oneof![
        Just(Class::Low),
        Just(Class::Normal),
        Just(Class::High),
        Just(Class::Critical)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => class().prop_map(Op::Admit),
        3 => (any::<usize>(), 1u64..200_000, any::<bool>())
            .prop_map(|(index, rt_us, served)| Op::Complete { index, rt_us, served }),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => (0u32..=1000).prop_map(|cpu| Op::Tick { cpu }),
        2 => (0u64..300).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn controller_invariants(ops in prop::collection::vec(op(), 1..400), cores in 1u32..4) {
        let c = Controller::new("p", ShedderConfig::adaptive()).unwrap();
        c.set_cores(f64::from(cores));
        let mut now = Duration::ZERO;
        let mut held: Vec<Permit<'_>> = Vec::new();
        c.tick(now, 0);
        for op in ops {
            match op {
                Op::Admit(class) => {
                    // Monotone: if a lower class gets in now, every higher class would too.
                    let order = [Class::Low, Class::Normal, Class::High, Class::Critical];
                    let lowest_ok = order.iter().position(|&k| c.admit(now, k).is_ok());
                    if let Some(i) = lowest_ok {
                        for &k in &order[i..] {
                            prop_assert!(c.admit(now, k).is_ok(), "{k:?} refused above {:?}", order[i]);
                        }
                    }
                    match c.admit(now, class) {
                        Ok(p) => held.push(p),
                        Err(_) => prop_assert!(class != Class::Critical, "critical shed"),
                    }
                }
                Op::Complete { index, rt_us, served } if !held.is_empty() => {
                    let p = held.swap_remove(index % held.len());
                    let outcome = if served { Outcome::Served } else { Outcome::Failed };
                    p.complete_with_rt(outcome, Duration::from_micros(rt_us));
                }
                Op::Drop(index) if !held.is_empty() => {
                    drop(held.swap_remove(index % held.len()));
                }
                Op::Tick { cpu } => {
                    c.tick(now, cpu);
                    let s = c.snapshot(now);
                    prop_assert!(s.limit >= f64::from(cores), "L {} below N {cores}", s.limit);
                    // C·f + N plus the queue allowance, at most 8·C (the trigger level).
                    prop_assert!(s.limit <= 9.0 * s.capacity + f64::from(cores) + 1e-9,
                        "L {} above 9·C {} + N", s.limit, s.capacity);
                }
                Op::Advance(ms) => now += Duration::from_millis(ms),
                _ => {}
            }
            prop_assert!(c.inflight() >= 0);
            prop_assert_eq!(c.inflight(), held.len() as i64);
        }
        drop(held);
        prop_assert_eq!(c.inflight(), 0);
    }

    #[test]
    fn nothing_is_shed_while_cold(ops in prop::collection::vec(op(), 1..300)) {
        // CPU under the threshold, the in-flight trigger and cap off: never hot.
        let cfg = ShedderConfig { hard_trigger: 0.0, hard_cap: 0.0, ..ShedderConfig::adaptive() };
        let c = Controller::new("p", cfg).unwrap();
        let mut now = Duration::ZERO;
        let mut held = Vec::new();
        for op in ops {
            match op {
                Op::Admit(class) => held.push(c.admit(now, class).expect("cold: admitted")),
                Op::Tick { cpu } => c.tick(now, cpu.min(899)),
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::Complete { index, rt_us, .. } if !held.is_empty() => {
                    let p = held.swap_remove(index % held.len());
                    p.complete_with_rt(Outcome::Served, Duration::from_micros(rt_us));
                }
                _ => {}
            }
        }
        prop_assert_eq!(c.snapshot(now).shed, [0; 4]);
    }
}
