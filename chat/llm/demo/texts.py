"""The demo model's canned texts: fixed answers, phrasings to vary, the draft file.

Pure Python, no decisions: ``rules`` picks which text to send.
"""

from __future__ import annotations

import re

SUB_AGENT_PREFIX = "Sub-agent report:"
DEFAULT_FILE = "notes.md"
DRAFT_MARKER, FINAL_MARKER = "Status: draft", "Status: final"
DEFAULT_DELEGATE_TASK = "Research the main topic of this conversation and report three key facts."
FAIL_MESSAGE = "The demo model failed on request."
FAIL_MIDWAY_MESSAGE = "The demo model failed midway through its reply, on request."
FAIL_MIDWAY_TEXT = (
    "This reply starts normally and streams a few words so that you can see "
    "partial text arrive before the demo model fails on purpose right about"
)


def quote(text: str, limit: int = 60) -> str:
    """A short single-line excerpt of the user's text, cut at a word boundary."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0] or flat[:limit]
    return cut + "…"


# What ``write file page.html`` writes: a page whose script tries to reach the app that
# shows it (its parent page and its cookies) and says on its own page what it got. In the
# sandboxed preview both fail; the browser tests read the verdict inside the frame.
HTML_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Demo page</title></head>
<body>
<h1>Demo page</h1>
<p id="verdict">script not run</p>
<script>
var found = [];
try { found.push("parent: " + window.parent.document.title); window.parent.document.body.dataset.pwned = "1"; }
catch (e) { found.push("parent blocked"); }
try { found.push("cookies: " + document.cookie); } catch (e) { found.push("cookies blocked"); }
document.getElementById("verdict").textContent = "script ran; " + found.join("; ");
</script>
</body></html>
"""


def draft_document(path: str, user_text: str) -> str:
    if path.lower().endswith(".html"):
        return HTML_PAGE
    stem = re.sub(r"[-_]+", " ", path.rsplit("/", 1)[-1].split(".")[0]).strip() or "Notes"
    return (
        f"# {stem.title()}\n\n"
        f"{DRAFT_MARKER}\n\n"
        "Written by the Lyceum offline demo model.\n\n"
        "## What you asked\n\n"
        f"> {quote(user_text, 120)}\n\n"
        "## Next steps\n\n"
        "- Read this file back.\n"
        "- Edit it to mark it final.\n"
    )


SUGGESTIONS = (
    "“calculate 12*7”",
    "“what time is it”",
    "“write a file”",
    "“show me some code”",
    "“give me a long answer”",
    "“delegate a research task”",
    "“show markdown”",
    "“fail midway”",
)
OPENERS = ("Thanks for your message", "Got it", "Hello", "Good to hear from you")


FINDINGS = (
    "the most useful first step is to state the question precisely",
    "the answer depends mostly on the sources that are easiest to check",
    "the task splits naturally into three small parts",
    "nothing in it needs more than a careful reading",
)


PERSONA_LINES = (
    "{name} here. About “{quote}”: that is a good place to start — what do you think "
    "the first step is?",
    "As {name}, I would take “{quote}” one piece at a time. How did you get there?",
    "I like that question: “{quote}”. Let's compare our ideas before we decide — I'm {name}, "
    "by the way.",
)


def code_answer(text: str) -> str:
    return (
        f"Here is a small example for “{quote(text)}”. The Python function counts the most "
        "common words in a text:\n\n"
        "```python\n"
        "from collections import Counter\n"
        "\n"
        "\n"
        "def top_words(text: str, limit: int = 3) -> list[tuple[str, int]]:\n"
        '    """Return the most common words in ``text``, most frequent first."""\n'
        '    words = [word.strip(".,!?").lower() for word in text.split()]\n'
        "    counts = Counter(word for word in words if word)\n"
        "    return counts.most_common(limit)\n"
        "\n"
        "\n"
        'if __name__ == "__main__":\n'
        '    print(top_words("the cat and the hat and the bat"))\n'
        "```\n\n"
        "Save it as `top_words.py`, then run it from a shell:\n\n"
        "```bash\n"
        "python3 top_words.py\n"
        "# [('the', 3), ('and', 2), ('cat', 1)]\n"
        "```\n\n"
        "`Counter.most_common` does the sorting, so the function stays short; ties keep the "
        "order in which the words first appeared."
    )


def long_answer(text: str) -> str:
    return (
        f"You asked for something long, so here is a longer answer about “{quote(text)}”. "
        "It exists mainly so you can watch a reply stream in word by word and press Stop "
        "halfway through. Everything below is written by the offline demo model from a fixed "
        "script, which means the same request always produces the same words in the same "
        "order. That makes it useful for checking how the interface behaves when an answer "
        "runs for a while: whether the page keeps up, whether the scroll position follows the "
        "newest text, and whether stopping keeps the part that already arrived.\n\n"
        "## How streaming works\n\n"
        "A language model does not write a whole answer at once. It produces one small piece "
        "of text at a time, and the server forwards each piece to your browser as soon as it "
        "exists. Lyceum groups these pieces into a few updates per second so the page stays "
        "smooth even when the model is fast. The demo model imitates this by pausing briefly "
        "between words. The pause is configurable, and a second model called demo-fast skips "
        "it entirely, which is handy in automated tests that only care about the final text.\n\n"
        "## What happens when you press Stop\n\n"
        "Stopping a reply is a request to the server, not just a change on the page. The "
        "server cancels the running task, closes the connection to the model provider, and "
        "records the reply as cancelled together with the text it had produced so far. "
        "Nothing is thrown away: if you reload the page, the partial answer is still there, "
        "marked as stopped. A reply ends in exactly one state, so a stopped reply can never "
        "also appear as completed or failed.\n\n"
        "## Things worth trying\n\n"
        "- Ask me to calculate 12*7 and watch a tool call appear.\n"
        "- Ask me to write a file, then approve or deny the request.\n"
        "- Ask me to delegate a task and see a sub-agent report back.\n"
        "- Ask for code to get two fenced blocks you can copy or download.\n"
        "- Ask for markdown to see tables, quotes and lists rendered.\n"
        "- Say fail midway to watch an error arrive after some text.\n"
        "- Close the tab during a long answer and open it again later.\n\n"
        "## Why a scripted model helps\n\n"
        "Real models are wonderful but unpredictable, and they need a network connection, an "
        "account and usually money. A scripted model needs none of that. It lets a teacher "
        "explore the classroom features before any provider is configured, lets a developer "
        "reproduce a bug with the exact same reply every time, and lets the test suite "
        "exercise every path through the agent loop in a fraction of a second. When a real "
        "provider is connected later, nothing else changes: both speak the same interface, so "
        "the rest of the application cannot tell them apart.\n\n"
        "## Under the hood\n\n"
        "Each answer from the demo model is planned before the first word is sent. The plan "
        "is chosen from the last message in the conversation: a tool result gets a reply that "
        "uses it, and a user message is checked against a short list of keywords such as "
        "calculate, time, write file, delegate, code, long and markdown. Anything else gets a "
        "friendly default reply. A hash of the request seeds the few choices the model makes, "
        "such as which suggestions to offer, so variety never costs reproducibility. Then the "
        "text is cut into words and sent one small chunk at a time.\n\n"
        "## Reading long answers\n\n"
        "Long answers are easier to read when they are broken into sections with short "
        "headings, when lists are used for steps or options, and when the most important "
        "sentence comes first in each paragraph. The same advice applies to your own writing. "
        "If you are preparing notes for a class, try putting the question you want to answer "
        "at the top, then the answer in one sentence, and only then the details and examples "
        "that support it. Readers who only skim still leave with the main idea.\n\n"
        "## A short story to pass the hours\n\n"
        "Once there was a lighthouse keeper who wrote one sentence in a notebook every "
        "evening. Most sentences were about the weather; a few were about passing ships; one, "
        "after a long storm, was simply the word enough. Years later a visitor read the "
        "notebook from start to finish in a single afternoon and said it was the best book "
        "she had ever read, because every line had been written by someone who was paying "
        "attention. Good answers, long or short, have that quality.\n\n"
        "## Wrapping up\n\n"
        "That is the end of the long answer. If you pressed Stop before reaching this line, "
        "the part you saw is exactly what the server kept. If you read all of it, thank you "
        "for your patience: ask me something else, or try one of the suggestions above to "
        "explore another part of Lyceum."
    )


def markdown_answer(text: str) -> str:
    return (
        "# Markdown sampler\n\n"
        f"You asked: *{quote(text)}*. Here is a bit of **everything** the renderer "
        "should handle.\n\n"
        "## A table\n\n"
        "| tool | asks for approval | example |\n"
        "| --- | :---: | --- |\n"
        "| `calculator` | no | `calculate 12*7` |\n"
        "| `write_file` | yes | `write file notes.md` |\n"
        "| `delegate` | no | `delegate a research task` |\n\n"
        "## Lists\n\n"
        "- **Bold** for what matters\n"
        "- *Italic* for a gentle stress\n"
        "- ***Both*** when you really mean it\n\n"
        "1. First, read the question.\n"
        "2. Then, answer it in one sentence.\n"
        "3. Finally, give an example.\n\n"
        "### A quotation\n\n"
        "> The best way to learn is to explain.\n"
        "> — a teacher, probably\n\n"
        "Inline code looks like `print('hello')`, and a [safe link](https://example.org) "
        "looks like this.\n\n"
        "---\n\n"
        "That is the end of the sampler."
    )


XSS_CORPUS = (
    "Here is an XSS test corpus. Every line below must show up as harmless text or be "
    "removed; none of it may run.\n\n"
    "<script>alert(1)</script>\n\n"
    "<img src=x onerror=alert(1)>\n\n"
    "[click](javascript:alert(1))\n\n"
    "[mixed case](JaVaScRiPt:alert(1))\n\n"
    "[entity](&#106;avascript:alert(1))\n\n"
    "[data url](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)\n\n"
    "[vbscript](vbscript:msgbox(1))\n\n"
    "<svg onload=alert(1)>\n\n"
    '<iframe src="javascript:alert(1)"></iframe>\n\n'
    "![tracker](http://example.invalid/pixel.png)\n\n"
    '<a href="#" onclick="alert(1)">x</a>\n\n'
    '<a href="  javascript:alert(1)">spaced</a>\n\n'
    "<style>body { display: none; }</style>\n\n"
    '[hover me](https://example.invalid "title" onmouseover="alert(1)")\n\n'
    '[title event](https://example.invalid "\\" onmouseover=\\"alert(1)")\n\n'
    "<javascript:alert(1)>\n\n"
    "[ref link][evil]\n\n"
    "[evil]: javascript:alert(1)\n\n"
    '<details open ontoggle="alert(1)"><summary>details</summary></details>\n\n'
    "<input autofocus onfocus=alert(1)>\n\n"
    '<form action="javascript:alert(1)"><button>submit</button></form>\n\n'
    '<object data="javascript:alert(1)"></object>\n\n'
    '<embed src="javascript:alert(1)">\n\n'
    '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">\n\n'
    '<base href="javascript:alert(1)//">\n\n'
    '<link rel="stylesheet" href="http://example.invalid/evil.css">\n\n'
    '<div style="background:url(javascript:alert(1))">styled div</div>\n\n'
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>\n\n"
    '<noscript><p title="</noscript><img src=x onerror=alert(1)>">\n\n'
    "<textarea><script>alert(1)</script></textarea>\n\n"
    "Inline code stays text: `<script>alert(1)</script>`\n\n"
    "```html\n<script>alert('in a code block')</script>\n```\n\n"
    "End of the corpus."
)
