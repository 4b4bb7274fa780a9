// The real openai npm client against the gateway (030-routes.py): the
// Responses API, not streamed and streamed, a chained response, and an
// audio transcription (the client's own multipart/form-data).  Prints one
// JSON line of what it saw; exits 1 with the error on any failure.
//
//   node openai_client.js OPENAI_MODULE_DIR BASE_URL API_KEY
'use strict';

const [moduleDir, baseURL, apiKey] = process.argv.slice(2);
const { OpenAI, toFile } = require(moduleDir);

async function main() {
    const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
    const out = {};

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
    console.log(JSON.stringify(out));
}

main().catch((e) => {
    console.error(String(e && e.stack || e));
    process.exit(1);
});
