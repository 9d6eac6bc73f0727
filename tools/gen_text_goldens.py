#!/usr/bin/env python3
"""Generates tests/data/text/tokenizer_goldens.jsonl: expected ids and decodes from HF `tokenizers`.

Usage: python3 tools/gen_text_goldens.py [--tokenizer PATH] [--out PATH]
       python3 tools/gen_text_goldens.py --embedded   # models/default/tokenizer.json ->
                                                     # tests/data/text/embedded_tokenizer_goldens.jsonl

For each corpus entry the record holds the input (`text`, or `bytes_b64` for invalid UTF-8, which
is decoded with errors="replace" first - the rule the C++ tokenizer implements), `table` ("v3" = the
tokenizer.json as is, "v4" = its added tokens replaced by the DeepSeek-V4 table of
chat-encoding.md section 1), `ids` (add_special_tokens=False), `ids_special` (=True), `decoded`
(skip_special_tokens=False) and `decoded_skip` (=True).
"""
import argparse
import base64
import gzip
import hashlib
import json
import os
import random
import sys
import tempfile

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TOK = "/work/shared/data/tokenizers/deepseek-v3/tokenizer.json"
BUNDLED_TOK = os.path.join(ROOT, "tests/data/text/deepseek-v3/tokenizer.json.gz")
GOLDENS = os.path.join(ROOT, "tests/data/text/dsv4-reference")


def default_tokenizer():
    """The shared V3 tokenizer.json, else the copy bundled (gzip'd) in tests/data/text."""
    if os.path.exists(SHARED_TOK):
        return SHARED_TOK
    out = os.path.join(tempfile.gettempdir(), "v4text_gen_tokenizer.json")
    with gzip.open(BUNDLED_TOK, "rb") as f, open(out, "wb") as g:
        g.write(f.read())
    return out


def v4_added_tokens():
    """DeepSeek-V4 (preview/0731) added-token table (chat-encoding.md section 1)."""
    t = []

    def add(i, s, special, normalized):
        t.append({"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": normalized, "special": special})
    add(0, "<｜begin▁of▁sentence｜>", True, False)
    add(1, "<｜end▁of▁sentence｜>", True, False)
    add(2, "<｜▁pad▁｜>", True, False)
    for n in range(800):
        add(128000 + n, f"<｜place▁holder▁no▁{n}｜>", True, False)
    names = ["<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
             "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
             "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
             "<｜tool▁output▁end｜>", "<｜tool▁sep｜>", "<｜begin▁of▁repo▁name｜>", "<｜end▁of▁repo▁name｜>",
             "<｜begin▁of▁file▁name｜>", "<｜end▁of▁file▁name｜>", "<｜begin▁of▁file｜>", "<｜end▁of▁file｜>",
             "<think>", "</think>", "<｜place▁holder▁for▁copy｜>", "<｜place▁holder▁for▁pointer▁replace｜>",
             "｜DSML｜", "<｜begin▁sys｜>", "<｜end▁sys｜>", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>",
             "<｜authority｜>", "<｜domain｜>", "<｜task｜>", "<｜political｜>", "<｜entity｜>", "<｜title｜>",
             "<｜safety｜>", "<｜answer｜>", "<｜search｜>", "<dsml:", "</dsml:", "<｜search▁begin｜>",
             "<｜search▁end｜>", "<｜extracted_url｜>", "<｜read_url｜>", "<｜end_of_query｜>"]
    for k, s in enumerate(names):
        add(128800 + k, s, 128800 + k == 128805, True)
    for i, s in [(129264, "<｜image2｜>"), (129265, "<｜/table>｜"), (129266, "<｜table｜>"), (129267, "<｜/td｜>"),
                 (129268, "<｜td｜>"), (129269, "<｜/tr｜>"), (129270, "<｜tr｜>"), (129279, "<｜image｜>")]:
        add(i, s, True, False)
    return t


def corpus():
    """(name, str or bytes, table) triples."""
    c = [
        ("english", "The capital of France is Paris. It's a lovely city; isn't it? I'd've gone."),
        ("english_para", "When in the Course of human events, it becomes necessary for one people to dissolve "
                         "the political bands which have connected them with another...\nWe hold these truths."),
        ("contractions", "don't won't shouldn't y'all 'tis I'M YOU'RE we've they'll she'd"),
        ("cjk", "你好，世界！今天天气很好。漢字テスト、ひらがなカタカナ。한국어 문장입니다. 𠀀𪚥 ｶﾀｶﾅ"),
        ("emoji", "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🤖✨ a👍b"),
        ("code_cpp", "#include <vector>\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n"
                     "  for (auto& x : v) x *= 2;  // double\n  return v.size() >= 3 ? 0 : 1;\n}\n"),
        ("code_python", "def f(x: int) -> int:\n    \"\"\"Doc.\"\"\"\n    if x <= 0:\n\treturn -x\n    return x ** 2 "
                        "// 3  # comment\n\n\nclass A(B):\n    pass\n"),
        ("code_json", '{"a": [1, 2.5, -3e10, true, null], "b": {"c": "d\\n"}, "e": "\\u00e9"}'),
        ("ws_long_spaces", "a" + " " * 300 + "b"),
        ("ws_mixed", "x \t \n\n\n   \r\n\t\t  \n y\n\n\n\n\n\n\n\n\n\n\n\nz   "),
        ("ws_only", " " * 1000),
        ("ws_newlines", "\n" * 257),
        ("ws_crlf", "\r\n\r\n line\r\n"),
        ("ws_unicode", "a\u00a0b\u3000c\u2028d\u2029e\u0085f\u1680g\u2003h\u202fi\u205fj\u180ek\u200bl"),
        ("digits", "1234567 12 1 0 00000000 3.14159 1,000,000 -42 +7 2024-01-02 ١٢٣٤٥ １２３４５ ۱۲۳ ⅫⅣ ½ ²³"),
        ("digits_long", "9" * 100 + " " + "0123456789" * 7),
        ("special_in_text", "<｜User｜>hello<｜Assistant｜><think>r</think>answer<｜end▁of▁sentence｜>"),
        ("special_adjacent", "<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>x<｜▁pad▁｜><｜place▁holder▁no▁12｜>y"),
        ("special_partial", "<｜User｜ <｜User <｜Use｜> ｜DSML｜ <think> </think> <thinking>"),
        ("special_tool", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"),
        ("marks", "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 \u0e01\u0e34 ﷽"),
        ("controls", "x\u0000y\u0001z\u001f\u007f\u0080\u009f end"),
        ("bom_zwj", "\ufeffBOM text\u200dzwj\u200cnonjoiner\u2060"),
        ("punct_runs", "!!! ??? ... --- === *** ;;\n >>> <<< ((()))\n\n:-) ¿¡ «quote» “smart” ‘s’ …"),
        ("urls", "https://example.com/path?q=1&r=a%20b#frag user@mail.org C:\\Windows\\sys32"),
        ("mixed_scripts", "Привет мир Ελληνικά עברית العربية हिन्दी ไทย Tiếng Việt ქართული"),
        ("math", "∑_{i=1}^{n} x_i² ≤ ∞ ∀x∈ℝ: |x| ≥ 0 → √2 ≈ 1.414 α+β=γ"),
        ("dsml", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
                 "string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"),
        ("empty", ""),
        ("single_space", " "),
        ("single_char", "a"),
        ("invalid_ff", b"abc\xffdef"),
        ("invalid_truncated_2", b"caf\xc3"),
        ("invalid_truncated_3", b"\xe4\xbd hello"),
        ("invalid_truncated_4", b"x\xf0\x9f\x98"),
        ("invalid_overlong", b"\xc0\xaf\xe0\x80\xaf"),
        ("invalid_surrogate", b"\xed\xa0\x80\xed\xbf\xbf ok"),
        ("invalid_above_max", b"\xf4\x90\x80\x80\xf8\x88\x80\x80\x80"),
        ("invalid_lone_cont", b"\x80\x81 \xbf text \xfe\xff"),
        ("invalid_mixed", b"\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xbd\xff<\xef\xbd\x9cUser\xef\xbd\x9c>"),
    ]
    # Long pathological runs (one huge pre-token piece, long BPE merges, regex backtracking).
    rnd = random.Random(1)
    mix = "".join(rnd.choice("ab c\n\t1.,;你😀é<｜User｜>") for _ in range(20000))
    c += [("long_letters", "a" * 10000), ("long_spaces", " " * 10000), ("long_newlines", "\n" * 5000),
          ("long_digits", "1" * 3000), ("long_cjk", "你" * 3000), ("long_space_letter", " a" * 4000),
          ("long_ws_mix", "\t \n" * 2000), ("long_emoji", "😀" * 2000), ("long_marks", "x" + "\u0301" * 2000),
          ("long_random_mix", mix)]
    out = [(n, s, "v3") for n, s in c]
    for n, s in c:
        if n.startswith("special") or n in ("dsml", "english", "cjk"):
            out.append((n + "_v4", s, "v4"))
    # Project text (own files): long English/Markdown with CJK, code.
    for rel in ["src/base/status.h", "src/base/thread_pool.cpp"]:
        p = os.path.join(ROOT, rel)
        if os.path.exists(p):
            out.append(("file_" + rel.replace("/", "_"), open(p, encoding="utf-8").read(), "v3"))
    # Every chat-golden prompt with the V4 table (what the server tokenizes).
    gp = os.path.join(GOLDENS, "chat-goldens.jsonl")
    if os.path.exists(gp):
        for line in open(gp, encoding="utf-8").read().split("\n"):
            if line:
                r = json.loads(line)
                if "prompt" in r:
                    out.append(("prompt_" + r["name"], r["prompt"], "v4"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=None, help="default: the DeepSeek V3 tokenizer.json")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/text/tokenizer_goldens.jsonl"))
    ap.add_argument("--embedded", action="store_true",
                    help="the embedded model's tokenizer; no V4 overlay; first line records its sha256")
    a = ap.parse_args()
    if a.tokenizer is None:
        a.tokenizer = default_tokenizer()
    if a.embedded:
        a.tokenizer = os.path.join(ROOT, "models/default/tokenizer.json")
        if a.out == ap.get_default("out"):
            a.out = os.path.join(ROOT, "tests/data/text/embedded_tokenizer_goldens.jsonl")
    raw = json.load(open(a.tokenizer, encoding="utf-8"))
    tv3 = Tokenizer.from_str(json.dumps(raw))
    v4 = dict(raw)
    table = v4_added_tokens()
    ids = {t["id"] for t in table}
    contents = {t["content"] for t in table}
    v4["added_tokens"] = sorted([t for t in raw["added_tokens"] if t["id"] not in ids and t["content"] not in contents]
                                + table, key=lambda t: t["id"])
    tv4 = Tokenizer.from_str(json.dumps(v4))
    n = 0
    with open(a.out, "w", encoding="utf-8", newline="\n") as f:
        if a.embedded:
            sha = hashlib.sha256(open(a.tokenizer, "rb").read()).hexdigest()
            f.write(json.dumps({"meta": {"tokenizer": "models/default/tokenizer.json", "sha256": sha}}) + "\n")
        for name, s, tab in corpus():
            if a.embedded and (tab == "v4" or name.startswith(("prompt_", "long_"))):
                continue
            tok = tv4 if tab == "v4" else tv3
            rec = {"name": name, "table": tab}
            if isinstance(s, bytes):
                rec["bytes_b64"] = base64.b64encode(s).decode()
                text = s.decode("utf-8", errors="replace")
            else:
                rec["text"] = s
                text = s
            ids_ = tok.encode(text, add_special_tokens=False).ids
            rec["ids"] = ids_
            rec["ids_special"] = tok.encode(text, add_special_tokens=True).ids
            rec["decoded"] = tok.decode(ids_, skip_special_tokens=False)
            rec["decoded_skip"] = tok.decode(ids_, skip_special_tokens=True)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    print(f"wrote {n} records to {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
