//! The routes' authentication built from `[[auth]]` and each route's `auth`: every
//! authenticator built once (and kept across snapshots while its config is unchanged, so a
//! DNS rebuild or an unrelated reload neither re-reads its files nor restarts its
//! watchers), each route's [`Gate`] found by router index. A refusal's answer is
//! `crate::respond::auth_refused`.

use std::collections::HashMap;
use std::sync::Arc;

use tailguard_auth::{
    ApiKey, ApiKeySettings, AuthMetrics, Authenticate, Basic, BasicSettings, Forward, Gate, Jwt,
    JwtSettings,
};
use tailguard_config::Config;
use tailguard_config::auth::{AuthConfig, AuthKind, StringList};
use tailguard_http::error::Error;
use tailguard_policy::route::Router;

/// The authentication of one snapshot.
#[derive(Debug, Default)]
pub(crate) struct Auth {
    /// Each route's gate, by router index (`None`: an open route).
    routes: Vec<Option<Gate>>,
    /// The authenticators by config, for the next snapshot to keep.
    built: Vec<(AuthConfig, Arc<dyn Authenticate>)>,
}

impl Auth {
    /// Builds every authenticator of `config` (or keeps `previous`'s of the same config)
    /// and each route's gate. Runs where snapshots are built (the reload thread), never on
    /// a serving thread: files are read here.
    pub(crate) fn build(
        config: &Config,
        router: &Router,
        previous: Option<&Auth>,
        metrics: &AuthMetrics,
    ) -> Result<Auth, Error> {
        let mut built = Vec::with_capacity(config.auth.len());
        let mut by_name: HashMap<&str, Arc<dyn Authenticate>> = HashMap::new();
        for a in &config.auth {
            let kept = previous.and_then(|p| {
                p.built
                    .iter()
                    .find(|(c, _)| c == a)
                    .map(|(_, auth)| Arc::clone(auth))
            });
            let auth = match kept {
                Some(auth) => {
                    auth.revise();
                    auth
                }
                None => build_one(config, a, metrics)?,
            };
            by_name.insert(a.name.get_ref().as_str(), Arc::clone(&auth));
            built.push((a.clone(), auth));
        }
        let by_id: HashMap<&str, &tailguard_config::RouteConfig> = config
            .routes
            .iter()
            .filter(|r| r.auth.is_some())
            .map(|r| (r.id.get_ref().as_str(), r))
            .collect();
        let mut routes = Vec::with_capacity(router.routes().len());
        for r in router.routes() {
            let Some(list) = by_id.get(&*r.id).and_then(|c| c.auth.as_ref()) else {
                routes.push(None);
                continue;
            };
            let mut members = Vec::new();
            for (_, name) in StringList::items(list) {
                let auth = by_name.get(name).ok_or_else(|| {
                    Error::Internal(format!("route `{}`: unknown auth `{name}`", r.id))
                })?;
                let counters = metrics
                    .handles(&r.id, name)
                    .map_err(|e| Error::Internal(format!("metrics: {e}")))?;
                members.push((Arc::from(name), Arc::clone(auth), counters));
            }
            routes.push(Some(Gate::new(members)));
        }
        Ok(Auth { routes, built })
    }

    /// The gate of the route at router index `route`, if it has one.
    #[inline]
    pub(crate) fn route(&self, route: usize) -> Option<&Gate> {
        self.routes.get(route).and_then(Option::as_ref)
    }
}

fn build_one(
    config: &Config,
    a: &AuthConfig,
    metrics: &AuthMetrics,
) -> Result<Arc<dyn Authenticate>, Error> {
    let name = a.name.get_ref();
    let fail = |e: String| Error::Internal(format!("auth `{name}`: {e}"));
    Ok(match &a.kind {
        AuthKind::ApiKey(k) => Arc::new(
            ApiKey::build(ApiKeySettings {
                name: name.clone(),
                from: k.sources(),
                consumers: k.consumers(),
                keys_file: k.keys_file(&config.base_dir),
                forward_key: k.forward_key,
            })
            .map_err(fail)?,
        ),
        AuthKind::Basic(b) => Arc::new(
            Basic::build(BasicSettings {
                name: name.clone(),
                htpasswd: b.htpasswd(&config.base_dir),
                realm: b
                    .realm
                    .as_ref()
                    .map_or_else(|| name.clone(), |r| r.get_ref().clone()),
                remember: std::time::Duration::from_secs(*b.remember_s.get_ref()),
                workers: *b.workers.get_ref(),
                queue: *b.queue.get_ref(),
                forward_credentials: b.forward_credentials,
            })
            .map_err(fail)?,
        ),
        AuthKind::Forward(f) => {
            Arc::new(Forward::build(f.settings(&config.base_dir).map_err(fail)?).map_err(fail)?)
        }
        AuthKind::Jwt(j) => {
            let secret = match j.secret_path(&config.base_dir) {
                Some(path) => Some(
                    std::fs::read(&path)
                        .map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?,
                ),
                None => None,
            };
            let key_metrics = metrics
                .key_set(name)
                .map_err(|e| Error::Internal(format!("metrics: {e}")))?;
            Arc::new(
                Jwt::build(
                    JwtSettings {
                        name: name.clone(),
                        jwks: j.jwks_location(&config.base_dir).map(|l| (l, j.refresh())),
                        jwks_ca: j.jwks_ca(&config.base_dir),
                        secret,
                        algorithms: j.algorithms(),
                        rules: j.rules(),
                        from: j.sources(),
                        claims_to_headers: j.claims_to_headers(),
                        forward_token: j.forward_token,
                        consumer_claim: j.consumer_claim.clone(),
                    },
                    key_metrics,
                )
                .map_err(fail)?,
            )
        }
    })
}
