//! The meter against each response shape the official SDKs read.

use super::*;

#[test]
fn the_meter_reads_what_the_official_sdks_read_from_each_response_shape() {
    let s = stand_in(None);
    let base = format!("http://127.0.0.1:{}", s.port);
    let sdk = sdk_usage(&format!("{base}/v1"), &base, &[]);
    let ask = json!([{"role": "user", "content": "look it up"}]);
    let calls = [
        (
            "chat",
            Provider::Openai,
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": ask}),
            false,
        ),
        (
            "chat_stream",
            Provider::Openai,
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": ask, "stream": true, "stream_options": {"include_usage": true}}),
            true,
        ),
        (
            "responses",
            Provider::Openai,
            "/v1/responses",
            json!({"model": "gpt-4.1", "input": "x"}),
            false,
        ),
        (
            "responses_stream",
            Provider::Openai,
            "/v1/responses",
            json!({"model": "gpt-4.1", "input": "x", "stream": true}),
            true,
        ),
        (
            "embeddings",
            Provider::Openai,
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": "x"}),
            false,
        ),
        (
            "messages",
            Provider::Anthropic,
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": ask}),
            false,
        ),
        (
            "messages_stream",
            Provider::Anthropic,
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": ask, "stream": true}),
            true,
        ),
    ];
    for (call, provider, path, request, streamed) in calls {
        let read = &sdk[call];
        let m = metered(provider, &post(s.port, path, &request), streamed);
        let usage = m
            .usage
            .unwrap_or_else(|| panic!("{call}: the meter found no usage"));
        let n = |k: &str| read[k].as_u64().unwrap();
        assert_eq!(
            usage.input + usage.cached_input,
            n("input"),
            "{call}: input {m:?} vs {read}"
        );
        assert_eq!(
            usage.cached_input,
            n("cached"),
            "{call}: cached {m:?} vs {read}"
        );
        assert_eq!(usage.output, n("output"), "{call}: output {m:?} vs {read}");
        assert_eq!(
            m.tool_calls,
            n("tool_calls"),
            "{call}: tool calls {m:?} vs {read}"
        );
    }

    // An OpenAI stream not asked for its usage carries none: the meter says so (the
    // gateway asks for it itself, and charges the reservation when none comes).
    let bare = post(
        s.port,
        "/v1/chat/completions",
        &json!({"model": "gpt-4o-mini", "messages": ask, "stream": true}),
    );
    let m = metered(Provider::Openai, &bare, true);
    assert_eq!((m.usage, m.tool_calls), (None, 1));
}
