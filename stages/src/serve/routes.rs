//! warp routes: OpenAI endpoints under /v1 (API-key protected when set), /health, /metrics, /version.
use super::errors::ApiError;
use super::state::AppState;
use super::{anthropic, chat, completions, limits, metrics, responses};
use laguna_engine::sched::Health;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

#[derive(Debug)]
struct Rejected(ApiError);
impl warp::reject::Reject for Rejected {}

/// A rejection on the Anthropic routes (answered with Anthropic's error object).
#[derive(Debug)]
struct RejectedAnthropic(ApiError);
impl warp::reject::Reject for RejectedAnthropic {}

fn with_state(
    state: Arc<AppState>,
) -> impl Filter<Extract = (Arc<AppState>,), Error = Infallible> + Clone {
    warp::any().map(move || state.clone())
}

/// `Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic clients) on /v1 routes when the
/// server has a key (vLLM's --api-key).
fn auth(state: Arc<AppState>) -> impl Filter<Extract = (), Error = Rejection> + Clone {
    auth_as(state, false)
}

fn auth_as(
    state: Arc<AppState>,
    anthropic: bool,
) -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::header::optional::<String>("authorization")
        .and(warp::header::optional::<String>("x-api-key"))
        .and_then(move |h: Option<String>, x: Option<String>| {
            let key = state.api_key.clone();
            async move {
                let bearer = h
                    .as_deref()
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::trim);
                match key {
                    None => Ok(()),
                    Some(k)
                        if bearer == Some(k.as_str())
                            || x.as_deref().map(str::trim) == Some(k.as_str()) =>
                    {
                        Ok(())
                    }
                    Some(_) if anthropic => Err(warp::reject::custom(RejectedAnthropic(
                        anthropic::unauthorized(),
                    ))),
                    Some(_) => Err(warp::reject::custom(Rejected(ApiError::unauthorized()))),
                }
            }
        })
        .untuple_one()
}

fn models_json(state: &AppState) -> serde_json::Value {
    let data: Vec<_> = state
        .served_names
        .iter()
        .map(|n| {
            json!({"id": n, "object": "model", "created": state.created, "owned_by": "laguna", "root": state.model_root,
                   "parent": null, "max_model_len": state.max_model_len,
                   "permission": [{"id": format!("modelperm-{n}"), "object": "model_permission", "created": state.created,
                                   "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
                                   "allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
                                   "organization": "*", "group": null, "is_blocking": false}]})
        })
        .collect();
    json!({"object": "list", "data": data})
}

pub fn routes(
    state: Arc<AppState>,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Infallible> + Clone {
    let health = warp::path!("health")
        .and(warp::get())
        .and(with_state(state.clone()))
        .map(|s: Arc<AppState>| match s.backend.health() {
            Health::Ready => warp::reply::with_status(
                warp::reply::json(&json!({"status": "ok"})),
                StatusCode::OK,
            )
            .into_response(),
            Health::Loading => ApiError::unavailable("Loading model").into_response(),
            Health::Failed(e) => {
                ApiError::unavailable(format!("The model failed to load: {e}")).into_response()
            }
        });
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(with_state(state.clone()))
        .map(|s: Arc<AppState>| {
            let text = metrics::render(&s.backend.metrics(), s.model_name());
            warp::reply::with_header(
                text,
                "content-type",
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .into_response()
        });
    let version = warp::path!("version").and(warp::get()).map(|| {
        warp::reply::json(&json!({"version": env!("CARGO_PKG_VERSION"), "server": "laguna"}))
            .into_response()
    });
    // One body filter for every POST route: the limit, streamed, in the route's error shape.
    let limit = state.limits.max_request_bytes;
    let body = limits::body(limit, |e| warp::reject::custom(Rejected(e)));
    let body_anthropic = limits::body(limit, |e| warp::reject::custom(RejectedAnthropic(e)));
    let v1 = warp::path("v1").and(auth(state.clone()));
    let models = v1
        .clone()
        .and(warp::path!("models"))
        .and(warp::get())
        .and(with_state(state.clone()))
        .map(|s: Arc<AppState>| warp::reply::json(&models_json(&s)).into_response());
    let chat = v1
        .clone()
        .and(warp::path!("chat" / "completions"))
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(body.clone())
        .then(chat::handle);
    // The path first: only requests for these routes get the Anthropic-shaped 401.
    let messages = warp::path!("v1" / "messages")
        .and(auth_as(state.clone(), true))
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(body_anthropic.clone())
        .then(anthropic::handle);
    let count_tokens = warp::path!("v1" / "messages" / "count_tokens")
        .and(auth_as(state.clone(), true))
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(body_anthropic)
        .then(anthropic::count_tokens);
    let store = Arc::new(responses::ResponseStore::new(responses::STORE_CAPACITY));
    let store_post = store.clone();
    let responses_post = v1
        .clone()
        .and(warp::path!("responses"))
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(warp::any().map(move || store_post.clone()))
        .and(body.clone())
        .then(responses::handle);
    let responses_get = v1
        .clone()
        .and(warp::path!("responses" / String))
        .and(warp::get())
        .map(move |id: String| responses::get(&store, &id));
    let completions = v1
        .and(warp::path!("completions"))
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(body)
        .then(completions::handle);
    health
        .or(metrics)
        .unify()
        .or(version)
        .unify()
        .or(models)
        .unify()
        .or(chat)
        .unify()
        .or(completions)
        .unify()
        .or(messages)
        .unify()
        .or(count_tokens)
        .unify()
        .or(responses_post)
        .unify()
        .or(responses_get)
        .unify()
        .recover(recover)
        .unify()
}

async fn recover(err: Rejection) -> Result<warp::reply::Response, Infallible> {
    if let Some(RejectedAnthropic(e)) = err.find::<RejectedAnthropic>() {
        return Ok(anthropic::error_response(e.clone()));
    }
    if let Some(Rejected(e)) = err.find::<Rejected>() {
        return Ok(e.clone().into_response());
    }
    if err.is_not_found() {
        return Ok(ApiError::not_found("Not Found").into_response());
    }
    if err.find::<warp::reject::MethodNotAllowed>().is_some() {
        return Ok(ApiError::method_not_allowed().into_response());
    }
    Ok(ApiError::bad_request(format!("{err:?}")).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::chat_template::ChatTemplate;
    use crate::serve::openai::SamplingDefaults;
    use laguna_engine::sched::{GenRequest, MetricsSnapshot, RequestStream, SubmitError};
    use std::path::Path;

    /// A backend that never finishes loading.
    struct Loading;
    impl laguna_engine::sched::Backend for Loading {
        fn submit(&self, _req: GenRequest) -> Result<RequestStream, SubmitError> {
            Err(SubmitError::Loading)
        }
        fn health(&self) -> Health {
            Health::Loading
        }
        fn metrics(&self) -> MetricsSnapshot {
            MetricsSnapshot::default()
        }
    }

    fn state(api_key: Option<&str>) -> Option<Arc<AppState>> {
        let dir = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/tiny-chat"
        ));
        let tok = laguna_engine::tokenizer::Tokenizer::from_dir(dir)
            .ok()
            .flatten()?;
        Some(Arc::new(AppState {
            backend: Arc::new(Loading),
            tokenizer: Arc::new(tok),
            template: ChatTemplate::from_dir(dir).unwrap(),
            served_names: vec!["tiny".into()],
            model_root: dir.display().to_string(),
            max_model_len: 64,
            api_key: api_key.map(str::to_string),
            created: 0,
            defaults: SamplingDefaults::default(),
            default_enable_thinking: false,
            grammar: None,
            limits: crate::serve::limits::Limits::new(1 << 20, None),
        }))
    }

    fn err_type(body: &[u8]) -> String {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        v["error"]["type"].as_str().unwrap().to_string()
    }

    #[tokio::test]
    async fn loading_is_503_and_errors_are_openai_objects() {
        let Some(s) = state(None) else { return };
        let r = routes(s);
        let res = warp::test::request().path("/health").reply(&r).await;
        assert_eq!(res.status(), 503);
        let chat = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let res = warp::test::request()
            .method("POST")
            .path("/v1/chat/completions")
            .body(chat)
            .reply(&r)
            .await;
        assert_eq!(res.status(), 503);
        assert_eq!(err_type(res.body()), "ServiceUnavailableError");
        let res = warp::test::request()
            .method("POST")
            .path("/v1/completions")
            .body(r#"{"prompt":"hi"}"#)
            .reply(&r)
            .await;
        assert_eq!(res.status(), 503);
        let res = warp::test::request()
            .method("POST")
            .path("/v1/chat/completions")
            .body(r#"{"model":"x","messages":[]}"#)
            .reply(&r)
            .await;
        assert_eq!(res.status(), 404);
        let res = warp::test::request().path("/v1/models").reply(&r).await;
        assert_eq!(res.status(), 200);
        let res = warp::test::request().path("/metrics").reply(&r).await;
        assert_eq!(res.status(), 200);
        assert!(std::str::from_utf8(res.body())
            .unwrap()
            .contains("vllm:num_requests_waiting{model_name=\"tiny\"} 0.0"));
        let res = warp::test::request().path("/nope").reply(&r).await;
        assert_eq!(
            (res.status().as_u16(), err_type(res.body()).as_str()),
            (404, "NotFoundError")
        );
    }

    #[tokio::test]
    async fn api_key_guards_v1_only() {
        let Some(s) = state(Some("k")) else { return };
        let r = routes(s);
        let res = warp::test::request().path("/v1/models").reply(&r).await;
        assert_eq!(
            (res.status().as_u16(), err_type(res.body()).as_str()),
            (401, "AuthenticationError")
        );
        let res = warp::test::request()
            .path("/v1/models")
            .header("authorization", "Bearer k")
            .reply(&r)
            .await;
        assert_eq!(res.status(), 200);
        let res = warp::test::request().path("/version").reply(&r).await;
        assert_eq!(res.status(), 200);
    }

    #[tokio::test]
    async fn anthropic_routes_take_x_api_key_and_answer_anthropic_errors() {
        let Some(s) = state(Some("k")) else { return };
        let r = routes(s);
        let body =
            r#"{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
        let kind = |b: &[u8]| {
            let v: serde_json::Value = serde_json::from_slice(b).unwrap();
            assert_eq!(v["type"], "error");
            v["error"]["type"].as_str().unwrap().to_string()
        };
        let post = |key: &'static str| {
            warp::test::request()
                .method("POST")
                .path("/v1/messages?beta=true")
                .header("x-api-key", key)
                .body(body)
        };
        let res = post("wrong").reply(&r).await;
        assert_eq!(res.status(), 401);
        assert_eq!(kind(res.body()), "authentication_error");
        let res = post("k").reply(&r).await; // past auth: the model is still loading
        assert_eq!(res.status(), 503);
        assert_eq!(kind(res.body()), "overloaded_error");
        let res = warp::test::request()
            .path("/v1/models")
            .header("x-api-key", "k")
            .reply(&r)
            .await;
        assert_eq!(res.status(), 200);
    }
}
