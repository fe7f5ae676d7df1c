"""The agent's tools on a LocalSandbox over a small git repository, and the text tool-call parser."""

from __future__ import annotations

import subprocess

import pytest

from pipeline.agent.textformat import FormatError, TextToolCall, describe_tools, parse_tool_call, tool_response
from pipeline.agent.tools import MAX_OUTPUT_CHARS, TOOLS, check_arguments, execute
from sandbox.local_sandbox import LocalSandbox

NAMES = ("bash", "edit", "submit")
CODE = "def f(x):\n    return x\n\n\ndef g(x):\n    return x\n"


def make_repo(path):
    """A git repository with one commit: pkg/code.py and README.md."""
    (path / "pkg").mkdir(parents=True)
    (path / "pkg" / "code.py").write_text(CODE)
    (path / "README.md").write_text("demo\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=path, check=True)
    return path


@pytest.fixture
def sandbox(tmp_path):
    with LocalSandbox(make_repo(tmp_path / "repo"), timeout=30) as box:
        yield box


def edit(sandbox, **arguments):
    return execute(sandbox, "edit", arguments)


def test_schemas_are_openai_function_tools():
    for tool in TOOLS:
        function = tool["function"]
        assert tool["type"] == "function" and function["name"] in NAMES and function["description"]
        assert function["parameters"]["type"] == "object"
        assert set(function["parameters"]["required"]) <= set(function["parameters"]["properties"])


def test_bash_returns_exit_code_and_output_and_keeps_the_session(sandbox):
    result = execute(sandbox, "bash", {"command": "cd pkg && ls; echo oops >&2; false"})
    assert result.output == "exit code: 1\ncode.py\noops" and not result.error and not result.submitted
    assert execute(sandbox, "bash", {"command": "pwd"}).output == f"exit code: 0\n{sandbox.workdir}/pkg"


def test_bash_timeout_kills_the_command_and_says_so(sandbox):
    result = execute(sandbox, "bash", {"command": "sleep 20"}, timeout=0.5)
    assert result.error and "timed out after 0.5 s" in result.output
    assert execute(sandbox, "bash", {"command": "echo alive"}).output == "exit code: 0\nalive"


def test_bash_long_output_is_cut_in_the_middle(sandbox):
    result = execute(sandbox, "bash", {"command": "seq 1 20000"})
    assert len(result.output) < MAX_OUTPUT_CHARS + 200 and "characters cut" in result.output
    assert result.output.startswith("exit code: 0\n1\n2\n") and result.output.endswith("\n20000")


def test_view_numbers_lines(sandbox):
    result = edit(sandbox, command="view", path="pkg/code.py")
    assert not result.error
    assert result.output.splitlines()[1:3] == ["     1\tdef f(x):", "     2\t    return x"]
    assert "lines 1-6 of 6" in result.output


@pytest.mark.parametrize("view_range, first, last", [([2, 3], 2, 3), ([5, -1], 5, 6), ([6, 99], 6, 6)])
def test_view_range(sandbox, view_range, first, last):
    lines = edit(sandbox, command="view", path="pkg/code.py", view_range=view_range).output.splitlines()[1:]
    assert [int(line.split("\t")[0]) for line in lines] == list(range(first, last + 1))


@pytest.mark.parametrize("view_range, message", [
    ([0, 2], "start 0 is outside the file's lines 1-6"),
    ([7, 8], "start 7 is outside"),
    ([4, 2], "end 2 is before its start 4"),
    ([1], "must be [start, end]"),
])
def test_view_bad_range(sandbox, view_range, message):
    result = edit(sandbox, command="view", path="pkg/code.py", view_range=view_range)
    assert result.error and message in result.output


def test_view_directory_lists_files_without_hidden_ones(sandbox):
    result = edit(sandbox, command="view", path=".")
    assert not result.error and "pkg/code.py" in result.output and "README.md" in result.output
    assert ".git" not in result.output


def test_view_missing_file(sandbox):
    result = edit(sandbox, command="view", path="nope.py")
    assert result.error and result.output == f"Error: {sandbox.workdir}/nope.py does not exist."


def test_create_in_new_directories_shows_in_the_diff(sandbox):
    result = edit(sandbox, command="create", path="new/deep/mod.py", file_text="X = 1\n")
    assert not result.error
    assert sandbox.read_file("new/deep/mod.py") == b"X = 1\n"
    assert "+++ b/new/deep/mod.py" in sandbox.diff()


def test_create_refuses_to_overwrite(sandbox):
    result = edit(sandbox, command="create", path="README.md", file_text="gone")
    assert result.error and "already exists" in result.output
    assert sandbox.read_file("README.md") == b"demo\n"


def test_str_replace_replaces_the_one_match_and_shows_it(sandbox):
    result = edit(sandbox, command="str_replace", path="pkg/code.py",
                  old_str="def g(x):\n    return x", new_str="def g(x):\n    return -x")
    assert not result.error and "     6\t    return -x" in result.output
    assert sandbox.read_file("pkg/code.py").decode() == CODE.replace("return x\n", "return -x\n", 2).replace(
        "return -x", "return x", 1)


def test_str_replace_zero_matches_changes_nothing(sandbox):
    result = edit(sandbox, command="str_replace", path="pkg/code.py", old_str="return  x", new_str="y")
    assert result.error and "does not occur verbatim" in result.output
    assert sandbox.diff() == ""


def test_str_replace_several_matches_says_how_many_and_where(sandbox):
    result = edit(sandbox, command="str_replace", path="pkg/code.py", old_str="return x", new_str="y")
    assert result.error and "occurs 2 times" in result.output and "lines 2, 6" in result.output
    assert sandbox.diff() == ""


def test_str_replace_without_new_str_deletes(sandbox):
    assert not edit(sandbox, command="str_replace", path="README.md", old_str="demo\n").error
    assert sandbox.read_file("README.md") == b""


def test_str_replace_keeps_bytes_that_are_not_utf8(sandbox):
    sandbox.write_file("latin.txt", b"caf\xe9\nold\n")
    assert not edit(sandbox, command="str_replace", path="latin.txt", old_str="old", new_str="new").error
    assert sandbox.read_file("latin.txt") == b"caf\xe9\nnew\n"


@pytest.mark.parametrize("after, expected", [
    (0, "# top\ndef f(x):\n"),
    (2, "def f(x):\n    return x\n# top\n\n"),
    (6, CODE + "# top\n"),
])
def test_insert_after_a_line(sandbox, after, expected):
    result = edit(sandbox, command="insert", path="pkg/code.py", insert_line=after, new_str="# top\n")
    assert not result.error and "# top" in result.output
    text = sandbox.read_file("pkg/code.py").decode()
    assert expected in text and text.count("\n") == CODE.count("\n") + 1


def test_insert_outside_the_file(sandbox):
    result = edit(sandbox, command="insert", path="pkg/code.py", insert_line=7, new_str="x")
    assert result.error and "outside 0-6" in result.output


def test_submit():
    result = execute(None, "submit", {})
    assert result.submitted and not result.error


@pytest.mark.parametrize("name, arguments, message", [
    ("grep", {"pattern": "x"}, "unknown tool 'grep'. Available tools: bash, edit, submit"),
    ("bash", {}, "bash needs the argument(s) command"),
    ("bash", {"cmd": "ls"}, "bash has no argument 'cmd'; its arguments are: command"),
    ("bash", {"command": ["ls"]}, "argument 'command' of bash must be a JSON string"),
    ("bash", {"command": "  "}, "the command is empty"),
    ("bash", "ls", "must be a JSON object"),
    ("edit", {"path": "a.py"}, "edit needs the argument(s) command"),
    ("edit", {"command": "delete", "path": "a.py"}, "must be one of view, create, str_replace, insert"),
    ("edit", {"command": "create", "path": "a.py"}, "edit create needs the argument(s) file_text"),
    ("edit", {"command": "str_replace", "path": "a.py"}, "edit str_replace needs the argument(s) old_str"),
    ("edit", {"command": "insert", "path": "a.py", "new_str": "x"}, "needs the argument(s) insert_line"),
    ("edit", {"command": "insert", "path": "a.py", "insert_line": "2", "new_str": "x"}, "must be a JSON integer"),
    ("edit", {"command": "view", "path": "a.py", "view_range": [1, "2"]}, "items must be a JSON integer"),
    ("edit", {"command": "view", "path": "a.py", "view_range": [True, 2]}, "items must be a JSON integer"),
])
def test_bad_calls_are_error_results(sandbox, name, arguments, message):
    result = execute(sandbox, name, arguments)
    assert result.error and not result.submitted and message in result.output
    # an empty command is well-formed: only running it fails; every other row fails the argument check itself
    assert check_arguments(name, arguments) == (None if message == "the command is empty" else result.output)


def test_edit_on_a_directory_or_through_a_file(sandbox):
    result = edit(sandbox, command="str_replace", path="pkg", old_str="a", new_str="b")
    assert result.error and "is a directory" in result.output
    result = edit(sandbox, command="create", path="README.md/x.py", file_text="")
    assert result.error and "README.md/x.py" in result.output


# -- the text tool-call format -------------------------------------------------------------

@pytest.mark.parametrize("text, call", [
    ('Let me look.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
     TextToolCall("bash", {"command": "ls"})),
    ('<tool_call>\n{"name": "submit"}\n</tool_call>\ntrailing words', TextToolCall("submit", {})),
])
def test_parse_tool_call(text, call):
    assert parse_tool_call(text, NAMES) == call


@pytest.mark.parametrize("text, message", [
    ("I think the bug is in f.", "no tool call found"),
    ('<tool_call>{"name": "bash", "arguments": {}}</tool_call><tool_call>{"name": "submit"}</tool_call>',
     "2 tool calls found"),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}', "not closed with </tool_call>"),
    ('<tool_call>{"name": "bash", "arguments": {"command": \'ls\'}}</tool_call>', "invalid JSON at line 1 column 43 of the tool call: Expecting value"),
    ('<tool_call>{"name": "bash"}\n{"x": 1}</tool_call>', "invalid JSON at line 2 column 1 of the tool call: Extra data"),
    ('<tool_call>["bash"]</tool_call>', 'must be a JSON object with a "name"'),
    ('<tool_call>{"name": "bash", "arguments": "ls"}</tool_call>', '"arguments" must be a JSON object'),
    ('<tool_call>{"name": "grep", "arguments": {}}</tool_call>', "unknown tool 'grep'. Available tools: bash"),
])
def test_parse_tool_call_format_errors(text, message):
    with pytest.raises(FormatError, match="Format error") as caught:
        parse_tool_call(text, NAMES)
    assert message in str(caught.value)


def test_describe_tools_shows_every_schema_and_the_format():
    text = describe_tools(TOOLS)
    assert all(f'"name": "{name}"' in text for name in NAMES)
    assert '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>' in text
    assert tool_response("out") == "<tool_response>\nout\n</tool_response>"
