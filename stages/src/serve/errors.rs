//! OpenAI/vLLM error objects: `{"error": {"message", "type", "param", "code"}}` with the HTTP status.
use serde_json::json;
use warp::http::StatusCode;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, "BadRequestError", message)
    }
    pub fn with_param(mut self, param: impl Into<String>) -> ApiError {
        self.param = Some(param.into());
        self
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::NOT_FOUND, "NotFoundError", message)
    }
    pub fn model_not_found(model: &str) -> ApiError {
        Self::not_found(format!("The model `{model}` does not exist.")).with_param("model")
    }
    pub fn unauthorized() -> ApiError {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "AuthenticationError",
            "Unauthorized: pass the server's API key as `Authorization: Bearer <key>`.",
        )
    }
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            message,
        )
    }
    pub fn overloaded(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "RateLimitError", message)
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            message,
        )
    }
    pub fn method_not_allowed() -> ApiError {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "Method Not Allowed",
        )
    }

    /// vLLM's wording for prompt + max_tokens over the context window.
    pub fn context_length(
        max_model_len: usize,
        max_tokens: usize,
        prompt_tokens: usize,
    ) -> ApiError {
        let total = max_tokens + prompt_tokens;
        let mut e = Self::bad_request(format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested {max_tokens} output tokens and your prompt contains at least {prompt_tokens} input tokens, for a total of at least {total} tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value={prompt_tokens})"
        ));
        e.param = Some("input_tokens".into());
        e
    }

    /// A prompt that alone fills the context window (vLLM's other message).
    pub fn prompt_too_long(max_model_len: usize, prompt_tokens: usize) -> ApiError {
        let mut e = Self::bad_request(format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_tokens} input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value={prompt_tokens})"
        ));
        e.param = Some("input_tokens".into());
        e
    }

    /// A prompt refused before tokenizing: its bytes alone prove it has over `max_model_len` tokens.
    pub fn prompt_far_too_long(max_model_len: usize, at_least: usize, bytes: usize) -> ApiError {
        let mut e = Self::bad_request(format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request has at least {at_least} input tokens ({bytes} bytes of text). Please reduce the length of the input messages. (parameter=input_tokens, value={at_least})"
        ));
        e.param = Some("input_tokens".into());
        e
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status.as_u16()}})
    }

    pub fn into_response(self) -> warp::reply::Response {
        use warp::Reply;
        warp::reply::with_status(warp::reply::json(&self.body()), self.status).into_response()
    }
}

impl warp::reply::Reply for ApiError {
    fn into_response(self) -> warp::reply::Response {
        ApiError::into_response(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn context_length_message_matches_vllm() {
        let e = ApiError::context_length(262144, 100000, 162145);
        assert_eq!(
            e.message,
            "This model's maximum context length is 262144 tokens. However, you requested 100000 output tokens and your prompt contains at least 162145 input tokens, for a total of at least 262145 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=162145)"
        );
        let b = e.body();
        assert_eq!(b["error"]["type"], "BadRequestError");
        assert_eq!(b["error"]["param"], "input_tokens");
        assert_eq!(b["error"]["code"], 400);
    }
}
