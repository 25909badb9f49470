// Submit a turn over turnpool's HTTP API and follow its events, in Node 18+ with no dependencies
// (Node has fetch but, before version 22, no EventSource: the SSE stream is read by hand here).
//
//   node examples/sse_client.mjs http://127.0.0.1:8080 examples.agents:streamer '{"count": 5}'
//
// Prints one JSON line per event, then the result; exits 0 when the turn completed.
const [url = "http://127.0.0.1:8080", agent = "examples.agents:streamer", input = "null"] = process.argv.slice(2);
const base = url.replace(/\/+$/, "");
const headers = { "content-type": "application/json" };
if (process.env.TURNPOOL_HTTP_TOKEN) headers.authorization = `Bearer ${process.env.TURNPOOL_HTTP_TOKEN}`;

const res = await fetch(`${base}/v1/turns`, {
  method: "POST",
  headers,
  body: JSON.stringify({ agent, input: JSON.parse(input) }),
});
if (!res.ok) throw new Error((await res.json()).error.message); // {error: {code, message}}
const { turn_id } = await res.json();

const stream = await fetch(`${base}/v1/turns/${encodeURIComponent(turn_id)}/events`, { headers });
const decoder = new TextDecoder();
let buffer = "";
let result = null;
for await (const chunk of stream.body) {
  buffer += decoder.decode(chunk, { stream: true });
  let cut;
  while ((cut = buffer.indexOf("\n\n")) >= 0) {
    const message = buffer.slice(0, cut);
    buffer = buffer.slice(cut + 2);
    let type = "message";
    let data = "";
    for (const line of message.split("\n")) {
      if (line.startsWith("event:")) type = line.slice(6).trim();
      else if (line.startsWith("data:")) data += line.slice(5).trim();
    }
    if (type === "event") console.log(JSON.stringify({ event: JSON.parse(data) }));
    else if (type === "gap") console.warn("missed", data);
    else if (type === "end") result = JSON.parse(data);
  }
}
console.log(JSON.stringify({ result }));
process.exit(result && result.outcome === "completed" ? 0 : 1);
