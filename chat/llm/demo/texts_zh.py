"""The demo model's canned texts in Simplified Chinese (``texts`` has the English ones).

The demo model answers in Chinese when the chat's language is Chinese (the system prompt
carries ``chat.core.prompts.CHINESE_LINE``) or when the user writes in Chinese.
"""

from __future__ import annotations

from chat.llm.demo.texts import quote

SUGGESTIONS = (
    "“计算 12*7”",
    "“现在几点”",
    "“写一个文件”",
    "“给我看一段代码”",
    "“来一个长回答”",
    "“委派一个研究任务”",
    "“展示 markdown”",
    "“fail midway”",
)
OPENERS = ("谢谢你的消息", "收到", "你好", "很高兴收到你的消息")


def tips(suggestions: list[str]) -> str:
    return f"试试{suggestions[0]}、{suggestions[1]}或{suggestions[2]}，看看 Lyceum 能做什么。"


def greeting(tips_text: str) -> str:
    return f"你好！我是 Lyceum 的离线演示模型。{tips_text}"


def default_answer(opener: str, text: str, tips_text: str) -> str:
    return (
        f"{opener}——你写道：“{quote(text)}”。我是 Lyceum 的离线演示模型，"
        f"按固定脚本回答，并不真正理解内容。{tips_text}"
    )


def default_reasoning(text: str) -> str:
    return (
        f"用户写道：“{quote(text)}”。没有匹配的演示关键词，所以我简短回答并给出一些可以尝试的内容。"
    )


def tool_missing(name: str, purpose: str) -> str:
    return f"我本想用 `{name}` 工具来{purpose}，但这个对话里没有这个工具，所以在这里做不到。"


def tool_reasoning(name: str, purpose: str) -> str:
    return f"用户请我{purpose}。我会调用 {name} 工具，拿到结果后再回答。"


TOOL_PURPOSES = {
    "calculator": "计算 {expression}",
    "current_time": "查询当前时间",
    "write_file": "写入 {path}",
    "edit_file": "把 {path} 标为定稿",
    "read_file": "读取 {path}",
    "list_files": "列出文件",
    "delegate": "把任务交给子代理",
}

DENIED_ACTIONS = {
    "write_file": "写入文件",
    "edit_file": "编辑文件",
    "read_file": "读取文件",
    "list_files": "列出文件",
    "calculator": "进行计算",
    "current_time": "查询时间",
    "delegate": "启动子代理",
}


def denied(action: str, reason: str) -> str:
    if reason:
        return f"明白了——你拒绝了，所以我没有{action}，理由是：{reason}。如果你想让我做别的事，请告诉我。"
    return f"明白了——你拒绝了，所以我没有{action}。如果你想让我做别的事，请告诉我。"


def expired(action: str) -> str:
    return f"审批请求已过期，所以我没有{action}。准备好了再问我一次。"


def tool_error(name: str, detail: str) -> str:
    return f"`{name}` 工具报告了一个错误，这一步没有成功：{detail}"


def result_text(tool_name: str, path: str, content: str, fenced: str, value: str) -> str:
    if tool_name == "calculator":
        return f"结果是 {value}。"
    if tool_name == "current_time":
        return f"现在的时间是 {content}。"
    if tool_name == "write_file":
        return (
            f"完成——我把 `{path}` 写成了一份简短的草稿。"
            f"让我“edit file {path}”可以把它标为定稿，或者“read file {path}”来查看它。"
        )
    if tool_name == "edit_file":
        return f"我更新了 `{path}`：“Status: draft”现在是“Status: final”。"
    if tool_name == "read_file":
        return f"这是 `{path}`：\n\n{fenced}"
    if tool_name == "list_files":
        return f"我能看到这些文件：\n\n{fenced}"
    if tool_name == "delegate":
        quoted = "\n".join(f"> {line}" for line in content[:2000].splitlines())
        return f"子代理完成了。它的报告如下：\n\n{quoted}"
    return f"`{tool_name}` 工具返回了：{quote(content, 200)}"


def code_answer(text: str) -> str:
    return (
        f"这是关于“{quote(text)}”的一个小例子。这个 Python 函数统计一段文字里最常见的词：\n\n"
        "```python\n"
        "from collections import Counter\n"
        "\n"
        "\n"
        "def top_words(text: str, limit: int = 3) -> list[tuple[str, int]]:\n"
        '    """返回 ``text`` 中最常见的词，出现最多的在前。"""\n'
        '    words = [word.strip(".,!?").lower() for word in text.split()]\n'
        "    counts = Counter(word for word in words if word)\n"
        "    return counts.most_common(limit)\n"
        "\n"
        "\n"
        'if __name__ == "__main__":\n'
        '    print(top_words("the cat and the hat and the bat"))\n'
        "```\n\n"
        "把它保存为 `top_words.py`，然后在终端里运行：\n\n"
        "```bash\n"
        "python3 top_words.py\n"
        "# [('the', 3), ('and', 2), ('cat', 1)]\n"
        "```\n\n"
        "排序由 `Counter.most_common` 完成，所以函数很短；出现次数相同的词保持它们第一次出现的顺序。"
    )


def long_answer(text: str) -> str:
    paragraph = (
        "语言模型不会一次写完整个回答。它每次生成一小段文字，服务器一拿到就转发给你的浏览器。"
        "Lyceum 把这些片段合并成每秒几次的更新，这样即使模型很快，页面也保持流畅。"
        "演示模型通过在词与词之间短暂停顿来模仿这一点。"
    )
    return (
        f"你想要一个长一点的回答，所以这里是关于“{quote(text)}”的长回答。"
        "它主要是为了让你看着回复一个词一个词地流进来，并在中途按下“停止”。"
        "下面的一切都由离线演示模型按固定脚本写出，同样的请求总是得到同样的文字。\n\n"
        "## 流式输出如何工作\n\n"
        f"{paragraph}\n\n"
        "## 按下停止时会发生什么\n\n"
        "停止回复是发给服务器的请求，而不只是页面上的变化。服务器取消正在运行的任务，"
        "关闭与模型提供方的连接，并把回复连同已经生成的文字记录为已停止。"
        "什么都不会丢：重新加载页面，部分回答仍然在那里。\n\n"
        "## 值得一试\n\n"
        "- 让我计算 12*7，看工具调用出现。\n"
        "- 让我写一个文件，然后批准或拒绝这个请求。\n"
        "- 让我委派一个任务，看子代理汇报。\n"
        "- 要一段代码，得到两个可以复制的代码块。\n"
        "- 在长回答进行中关闭标签页，稍后再打开。\n\n"
        "## 为什么脚本化的模型有用\n\n"
        "真实的模型很出色，但难以预测，而且需要网络、账号，通常还要花钱。"
        "脚本化的模型这些都不需要：老师可以在配置任何提供方之前探索课堂功能，"
        "开发者每次都能用完全相同的回复复现问题，测试也能在一瞬间走遍代理循环的每条路径。\n\n"
        "## 结束\n\n"
        "长回答到此结束。如果你在读到这一行之前按了停止，你看到的部分正是服务器保存的内容。"
        "如果你读完了，谢谢你的耐心：问我别的问题，或者试试上面的建议。"
    )


def markdown_answer(text: str) -> str:
    return (
        "# Markdown 示例\n\n"
        f"你问的是：*{quote(text)}*。这里有渲染器应该处理的**各种**内容。\n\n"
        "## 表格\n\n"
        "| 工具 | 需要审批 | 示例 |\n"
        "| --- | :---: | --- |\n"
        "| `calculator` | 否 | `计算 12*7` |\n"
        "| `write_file` | 是 | `write file notes.md` |\n"
        "| `delegate` | 否 | `delegate a research task` |\n\n"
        "## 列表\n\n"
        "- **粗体**表示重要\n"
        "- *斜体*表示轻微强调\n\n"
        "1. 先读题。\n"
        "2. 再用一句话回答。\n"
        "3. 最后举一个例子。\n\n"
        "### 引文\n\n"
        "> 学习的最好方法是讲给别人听。\n\n"
        "行内代码是这样的：`print('hello')`。\n\n"
        "---\n\n"
        "示例到此结束。"
    )


def sub_agent_report(prefix: str, task: str) -> str:
    return f"{prefix} 我研究了“{quote(task)}”，发现最有用的第一步是把问题说清楚。没有其他需要主代理关注的事。"
