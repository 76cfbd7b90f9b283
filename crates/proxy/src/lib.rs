//! The gateway: config, routes, upstreams, pools, balancing and the HTTP data path.
