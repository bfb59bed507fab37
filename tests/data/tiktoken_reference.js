// Reference ids for tokenizer_test: OpenAI's tiktoken (npm "tiktoken", the
// WASM build of OpenAI's Rust tokenizer) encodes each string of a JSON array
// with the "gpt2" encoding.
//
//   node tiktoken_reference.js NPM_PREFIX STRINGS.json
//
// prints a JSON array with one array of ids per string. NPM_PREFIX is where
// `npm install --prefix NPM_PREFIX tiktoken` put the package.
"use strict";
const fs = require("fs");
const path = require("path");

const [prefix, stringsFile] = process.argv.slice(2);
const { get_encoding } = require(path.join(prefix, "node_modules", "tiktoken"));
const strings = JSON.parse(fs.readFileSync(stringsFile, "utf8"));
const encoding = get_encoding("gpt2");
// encode_ordinary: special tokens in the text are plain text, as in Tessera.
const ids = strings.map((s) => Array.from(encoding.encode_ordinary(s)));
encoding.free();
process.stdout.write(JSON.stringify(ids));
