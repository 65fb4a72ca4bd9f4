#!/usr/bin/env python3
"""Maker: a one-line summary of the payload's `text`, from a model, with the `openai` SDK.

Nothing steward-specific: the SDK reads OPENAI_BASE_URL and OPENAI_API_KEY, which steward
sets to its gateway and to this run's key. It reports nothing on fd 3; the gateway meters.
"""

import json
import sys

context = json.load(sys.stdin)
text = (context.get("trigger", {}).get("payload") or {}).get("text") or "steward"
try:
    import openai
except ImportError:
    sys.exit("the `openai` package is not installed for this python (pip install openai)")

client = openai.OpenAI(max_retries=1)
answer = client.chat.completions.create(
    model="gpt-4o-mini",
    max_completion_tokens=120,
    messages=[
        {"role": "system", "content": "Summarise the user's text in one short line."},
        {"role": "user", "content": text},
    ],
)
print(json.dumps({"summary": answer.choices[0].message.content}))
