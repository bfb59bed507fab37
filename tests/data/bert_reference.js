// Reference ids for tokenizer_test's BERT cases: Hugging Face's
// tokenizers.js (npm "@huggingface/tokenizers", pure JavaScript), whose
// BertNormalizer, BertPreTokenizer and WordPiece model follow BERT's
// reference tokenizer.
//
//   node bert_reference.js NPM_PREFIX LOWER_CASE VOCAB.json STRINGS.json
//
// LOWER_CASE is "true" or "false", VOCAB.json the vocabulary as an array
// (id = index), STRINGS.json an array of texts. Prints a JSON array with one
// array of ids per text.
"use strict";
const fs = require("fs");
const path = require("path");

const [prefix, lowerCaseArg, vocabFile, stringsFile] = process.argv.slice(2);
const { Tokenizer } = require(path.join(prefix, "node_modules", "@huggingface", "tokenizers"));
const tokens = JSON.parse(fs.readFileSync(vocabFile, "utf8"));
const strings = JSON.parse(fs.readFileSync(stringsFile, "utf8"));
const lowerCase = lowerCaseArg === "true";

const vocab = {};
tokens.forEach((token, id) => {
  vocab[token] = id;
});
// No added tokens and no post-processor: "[SEP]" written in a text is plain
// text, and nothing is added around an encoding, as in Tessera.
const tokenizerJson = {
  normalizer: {
    type: "BertNormalizer",
    clean_text: true,
    handle_chinese_chars: true,
    strip_accents: null,
    lowercase: lowerCase,
  },
  pre_tokenizer: { type: "BertPreTokenizer" },
  model: {
    type: "WordPiece",
    vocab,
    unk_token: "[UNK]",
    continuing_subword_prefix: "##",
    max_input_chars_per_word: 100,
  },
  post_processor: null,
  decoder: { type: "WordPiece", prefix: "##", cleanup: false },
  added_tokens: [],
};
const tokenizer = new Tokenizer(tokenizerJson, { clean_up_tokenization_spaces: false });
const ids = strings.map((s) => tokenizer.encode(s, { add_special_tokens: false }).ids);
process.stdout.write(JSON.stringify(ids));
