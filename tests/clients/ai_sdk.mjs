// One turn of the Vercel AI SDK through the gateway, with the provider's defaults (only the
// base URL and the key set): node ai_sdk.mjs <responses|chat|anthropic> <generate|stream> <prompt>
// Prints one JSON line: the text, the finish reason, the usage, or the error it ended with.
import { generateText, streamText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";

const [kind, mode, prompt] = process.argv.slice(2);
const baseURL = process.env.HARDCAP_BASE_URL;
const apiKey = process.env.HARDCAP_KEY;
const models = {
  responses: () => createOpenAI({ baseURL: `${baseURL}/v1`, apiKey })("m"),
  chat: () => createOpenAI({ baseURL: `${baseURL}/v1`, apiKey }).chat("m"),
  anthropic: () => createAnthropic({ baseURL: `${baseURL}/v1`, apiKey })("claude"),
};
const model = models[kind]();

function failure(error) {
  const cause = error?.lastError ?? error;
  return {
    error: String(error?.message ?? error),
    name: error?.name,
    status: cause?.statusCode,
    retryable: cause?.isRetryable,
    attempts: error?.errors?.length ?? 1,
  };
}

try {
  if (mode === "generate") {
    const r = await generateText({ model, prompt });
    console.log(JSON.stringify({ text: r.text, finishReason: r.finishReason, usage: r.usage }));
  } else {
    let streamError;
    const r = streamText({ model, prompt, onError: ({ error }) => { streamError = error; } });
    let text = "";
    for await (const part of r.textStream) text += part;
    if (streamError) throw streamError;
    console.log(JSON.stringify({ text, finishReason: await r.finishReason, usage: await r.usage }));
  }
} catch (error) {
  console.log(JSON.stringify(failure(error)));
  process.exitCode = 1;
}
