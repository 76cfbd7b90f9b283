//! CPU-aware adaptive load shedding, adaptive breaker and p2c-EWMA balancing, as tower layers.
