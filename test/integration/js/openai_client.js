// SPDX-License-Identifier: MIT
// Real clients against the gateway (030-routes.py): the openai npm
// client's Responses API (not streamed, streamed, chained) and an audio
// transcription (the client's own multipart/form-data); then the Vercel
// AI SDK's default provider, openai(model), which calls the Responses
// API, with generateText and streamText.  Prints one JSON line of what
// they saw; exits 1 with the error on any failure.
//
//   node openai_client.js NPM_DIR BASE_URL API_KEY
'use strict';

const { createRequire } = require('module');
const path = require('path');

const [npmDir, baseURL, apiKey] = process.argv.slice(2);
const need = createRequire(path.join(path.resolve(npmDir), 'package.json'));
const { OpenAI, toFile } = need('openai');
const { createOpenAI } = need('@ai-sdk/openai');
const { generateText, streamText } = need('ai');

async function openaiClient(out) {
    const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

    const r = await client.responses.create({ model: 'mock-model',
                                              input: 'hello there' });
    out.plain = { id: r.id, text: r.output_text, usage: r.usage };

    const stream = await client.responses.create({
        model: 'mock-model', input: 'stream it', stream: true });
    const types = [];
    let text = '';
    let done = null;
    for await (const ev of stream) {
        types.push(ev.type);
        if (ev.type === 'response.output_text.delta')
            text += ev.delta;
        if (ev.type === 'response.completed')
            done = ev.response;
    }
    out.stream = { types, text,
                   final_text: done && done.output[0].content[0].text,
                   usage: done && done.usage };

    const chained = await client.responses.create({
        model: 'mock-model', input: 'and then', previous_response_id: r.id });
    out.chained = { previous: chained.previous_response_id };

    const tr = await client.audio.transcriptions.create({
        model: 'mock-model',
        file: await toFile(Buffer.from('RIFF\0\0\0\0WAVEfmt '), 'a.wav'),
    });
    out.transcription = tr;
}

async function aiSdk(out) {
    const openai = createOpenAI({ baseURL, apiKey, maxRetries: 0 });
    const g = await generateText({ model: openai('mock-model'),
                                   prompt: 'hello', maxRetries: 0 });
    out.ai_generate = { text: g.text, usage: g.usage };
    const s = streamText({ model: openai('mock-model'), prompt: 'stream',
                           maxRetries: 0 });
    let text = '';
    for await (const d of s.textStream)
        text += d;
    out.ai_stream = { text, usage: await s.usage };
}

async function main() {
    const out = {};
    await openaiClient(out);
    await aiSdk(out);
    console.log(JSON.stringify(out));
}

main().catch((e) => {
    console.error(String(e && e.stack || e));
    process.exit(1);
});
