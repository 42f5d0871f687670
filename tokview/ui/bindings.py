"""Every key tokview binds, declared once: id, default keys, action, description, where it applies.

Why one registry: screens, the footer, the help screen, the command palette and the `[keymap]` check in
the config all read this table, so none of them can drift from the keys (a binding missing from help, a
remap refused because help did not list it). This module imports no screen: it sits below all of them,
so `ui/app.py` and `ui/screens/help.py` never import each other.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Key:
    """One binding. `group` is where it applies (see SCOPES); `footer` shows it in the footer, under
    `label` when the description is too long for a footer cell; `palette` lists it in the command palette
    (cursor moves and modal keys are not commands)."""

    id: str
    keys: str
    action: str
    description: str
    group: str
    help: str = ""
    footer: bool = False
    palette: bool = True
    key_display: str | None = None
    priority: bool = False
    label: str = ""

    @property
    def footer_label(self) -> str:
        return self.label or self.description

    def binding(self) -> Binding:
        return Binding(
            self.keys,
            self.action,
            self.footer_label,
            show=self.footer,
            key_display=self.key_display,
            priority=self.priority,
            tooltip=self.help or self.description,
            id=self.id,
        )


KEYS: tuple[Key, ...] = (
    # everywhere (the app): ? first, so the footer never cuts it off
    Key(
        "app.help",
        "question_mark,f1",
        "help",
        "Help",
        "everywhere",
        "All keys, from this table.",
        footer=True,
        key_display="?",
    ),
    Key(
        "curate.approve",
        "a",
        "approve",
        "Approve",
        "everywhere",
        "Approve the sample (listed, inspected, or a session's turn), or the marked ones (asks first about error findings).",
        footer=True,
    ),
    Key(
        "curate.reject",
        "r",
        "reject",
        "Reject",
        "everywhere",
        "Reject the sample, or the marked ones, with a reason picked or typed.",
        footer=True,
    ),
    Key(
        "curate.note",
        "n",
        "note",
        "Note",
        "everywhere",
        "Attach a note to the sample, or the marked ones.",
        footer=True,
    ),
    Key(
        "curate.tag",
        "t",
        "tag",
        "Tag",
        "everywhere",
        "Tag the sample or the marked ones (comma-separated), or pick a tag to add or remove.",
        footer=True,
    ),
    Key(
        "curate.undo",
        "u",
        "undo",
        "Undo",
        "everywhere",
        "Take back the latest action wherever it was made (a bulk one, or tokview review's, as one step).",
        footer=True,
    ),
    Key(
        "curate.history",
        "U",
        "undo_history",
        "Undo an earlier action",
        "everywhere",
        "List the latest actions (the app's and tokview review's) and take back the one chosen, as one step.",
    ),
    Key(
        "app.export",
        "E",
        "export",
        "Export",
        "everywhere",
        "Export samples as tokview export does (format, selection, tags, path), with its summary.",
    ),
    Key(
        "curate.next",
        "right_square_bracket",
        "next_unreviewed",
        "Next pending",
        "everywhere",
        "Go to the next sample nobody has reviewed yet.",
        footer=True,
        key_display="]",
        label="Next",
    ),
    Key(
        "app.generate", "g", "generate", "Generate", "everywhere", "Open the generate panel.", footer=True, label="Gen"
    ),
    Key("app.doctor", "D", "doctor", "Doctor", "everywhere", "Check the connected server.", footer=True),
    Key("app.stats", "S", "stats", "Stats", "everywhere", "Plots of lengths, finish reasons, findings.", footer=True),
    Key(
        "app.theme",
        "T",
        "toggle_theme",
        "Light / dark",
        "everywhere",
        "Switch between light and dark.",
        footer=True,
        label="Theme",
    ),
    Key(
        "app.sessions",
        "V",
        "sessions",
        "Sessions",
        "everywhere",
        "The conversations tokview proxy recorded, live; enter opens one as its chain of turns.",
    ),
    Key("app.quit", "q", "quit", "Quit", "everywhere", "Leave tokview.", footer=True),
    # the samples screen and its list
    Key(
        "samples.search",
        "slash",
        "focus_search",
        "Search",
        "samples",
        "Search ids, the prompt's and the answer's text and tool calls, tags and notes (acc<=2.5, nll<=1.5 filter too).",
        footer=True,
        key_display="/",
    ),
    Key("samples.sort", "o", "cycle_order", "Sort", "samples", "Cycle the sort order of the list.", footer=True),
    Key("samples.reload", "ctrl+r", "reload", "Reload", "samples", "Count and load the list again.", footer=True),
    Key(
        "samples.focus-list",
        "escape",
        "focus_list",
        "Back to the list",
        "samples",
        "Move focus from the filters to the list.",
        palette=False,
    ),
    Key("list.open", "enter", "open", "Inspect", "sample list", "Open the sample under the cursor.", footer=True),
    Key(
        "list.mark",
        "space",
        "toggle_mark",
        "Mark",
        "sample list",
        "Mark or unmark the sample under the cursor (a, r, t, n then act on every marked sample).",
        footer=True,
    ),
    Key(
        "list.mark-range",
        "M",
        "mark_range",
        "Mark range",
        "sample list",
        "Mark every sample from the last one marked to the cursor.",
    ),
    Key(
        "list.mark-all",
        "asterisk",
        "mark_all",
        "Mark all shown",
        "sample list",
        "Mark everything the current filter shows; with marks set, clear them.",
        key_display="*",
    ),
    Key("list.copy-id", "c", "copy_id", "Copy sample id", "sample list", "Copy the sample id under the cursor."),
    Key(
        "list.compare",
        "d",
        "compare",
        "Compare",
        "sample list",
        "Compare the two marked samples, else the one under the cursor with the same prompt and turn from another run.",
    ),
    Key("list.up", "up,k", "move(-1)", "Previous sample", "sample list", palette=False),
    Key("list.down", "down,j", "move(1)", "Next sample", "sample list", palette=False),
    Key("list.pageup", "pageup", "page(-1)", "Page up", "sample list", palette=False),
    Key("list.pagedown", "pagedown", "page(1)", "Page down", "sample list", palette=False),
    Key("list.home", "home", "first", "First sample", "sample list", palette=False),
    Key("list.end", "end", "last", "Last sample", "sample list", palette=False),
    # inspect and its token panes
    Key(
        "inspect.mode",
        "v",
        "cycle_mode",
        "View mode",
        "inspect",
        "Cycle pieces / ids / both (piece over id).",
        footer=True,
        label="View",
    ),
    Key(
        "inspect.findings",
        "f",
        "focus_findings",
        "Findings",
        "inspect",
        "Move focus to the findings list.",
        footer=True,
        label="Finding",
    ),
    Key(
        "inspect.swap",
        "s",
        "swap_pane",
        "Other pane",
        "inspect",
        "Move focus to the other token pane.",
        footer=True,
        label="Pane",
    ),
    Key(
        "inspect.next-position",
        "enter,N",
        "finding_position(1)",
        "Next position",
        "inspect",
        "Step to the chosen finding's next position, round to its first (enter on the finding again does too).",
    ),
    Key(
        "inspect.previous-position",
        "P",
        "finding_position(-1)",
        "Previous position",
        "inspect",
        "Step back to the chosen finding's previous position.",
    ),
    Key(
        "inspect.heat",
        "h",
        "cycle_heat",
        "Heat",
        "inspect",
        "Colour output tokens by acceptance run, sampled logprob or target logprob (then segments again).",
    ),
    Key(
        "inspect.goto",
        "colon",
        "goto",
        "Go to",
        "inspect",
        "Go to a position (120), an id (#163607) or a text; : again and enter finds the next one.",
        key_display=":",
    ),
    Key("inspect.copy-id", "c", "copy_sample_id", "Copy sample id", "inspect", "Copy the sample id to the clipboard."),
    Key(
        "inspect.copy-token",
        "C",
        "copy_token",
        "Copy token",
        "inspect",
        "Copy the text of the token under the cursor to the clipboard.",
    ),
    Key(
        "inspect.auto-advance",
        "greater_than_sign",
        "toggle_auto_advance",
        "Auto-advance",
        "inspect",
        "Toggle: a verdict opens the next pending sample ([ui] auto_advance sets it at start).",
        key_display=">",
    ),
    Key(
        "inspect.compare",
        "d",
        "compare",
        "Compare",
        "inspect",
        "Compare with the same prompt and turn from another run: ids side by side, first divergence marked.",
    ),
    Key(
        "inspect.next-turn",
        "w",
        "walk_turn(1)",
        "Next turn",
        "inspect",
        "Walk the conversation: the next turn of this prompt and generation (served or file history said).",
    ),
    Key(
        "inspect.previous-turn",
        "W",
        "walk_turn(-1)",
        "Previous turn",
        "inspect",
        "Walk the conversation back to the previous turn.",
    ),
    Key("inspect.back", "escape", "close", "Back", "inspect", "Back to the samples list.", footer=True),
    Key("token.left", "left", "cursor(-1)", "Previous token", "token panes", palette=False),
    Key("token.right", "right", "cursor(1)", "Next token", "token panes", palette=False),
    Key("token.up", "up,k", "cursor_row(-1)", "Token above", "token panes", palette=False),
    Key("token.down", "down,j", "cursor_row(1)", "Token below", "token panes", palette=False),
    Key("token.pageup", "pageup", "cursor_page(-1)", "Page up", "token panes", palette=False),
    Key("token.pagedown", "pagedown", "cursor_page(1)", "Page down", "token panes", palette=False),
    Key("token.home", "home", "cursor_to_start", "First token", "token panes", palette=False),
    Key("token.end", "end", "cursor_to_end", "Last token", "token panes", palette=False),
    # panels
    Key("generate.run", "ctrl+s", "run", "Run", "generate", "Start the batch with these settings.", footer=True),
    Key(
        "generate.cancel",
        "ctrl+c",
        "cancel",
        "Cancel run",
        "generate",
        "Stop the running batch (written samples stay).",
        footer=True,
        priority=True,
        label="Cancel",
    ),
    Key("generate.back", "escape", "close", "Back", "generate", "Back to the samples list.", footer=True),
    Key(
        "doctor.run",
        "ctrl+s",
        "run",
        "Run checks",
        "doctor",
        "Probe the server and run the doctor's checks.",
        footer=True,
        label="Check",
    ),
    Key(
        "doctor.cancel",
        "ctrl+c",
        "cancel",
        "Cancel checks",
        "doctor",
        "Stop the running checks (a server that never answers held them for minutes).",
        footer=True,
        priority=True,
        label="Cancel",
    ),
    Key(
        "doctor.back",
        "escape",
        "close",
        "Back",
        "doctor",
        "Stop the running checks; when none run, back to the samples list.",
        footer=True,
    ),
    Key("stats.reload", "ctrl+r", "reload", "Reload", "stats", "Read the numbers again.", footer=True),
    Key("stats.back", "escape", "close", "Back", "stats", "Back to the samples list.", footer=True),
    Key(
        "compare.divergence",
        "x",
        "first_divergence",
        "First divergence",
        "compare",
        "Move both cursors to the first position where the two samples' ids differ.",
        footer=True,
        label="Diverge",
    ),
    Key(
        "compare.swap",
        "s",
        "swap_pane",
        "Other pane",
        "compare",
        "Move focus to the other sample.",
        footer=True,
        label="Pane",
    ),
    Key("compare.back", "escape", "close", "Back", "compare", "Back to where compare was opened.", footer=True),
    # the proxied sessions list and a session's turns
    Key("sessions.open", "enter", "open", "Open", "sessions", "Open the session as its chain of turns.", footer=True),
    Key("sessions.reload", "ctrl+r", "reload", "Reload", "sessions", "Read the sessions again.", footer=True),
    Key("sessions.back", "escape", "close", "Back", "sessions", "Back to where sessions was opened.", footer=True),
    Key("turns.open", "enter", "open", "Inspect", "session turns", "Open the turn in the inspect screen.", footer=True),
    Key("turns.reload", "ctrl+r", "reload", "Reload", "session turns", "Read the turns again.", footer=True),
    Key("turns.back", "escape", "close", "Back", "session turns", "Back to the sessions list.", footer=True),
    # modals and help: they take every key while open; a dialog's own footer (KeysFooter) shows its keys
    # (footer=True), and the screen's footer under it is hidden (widgets/footer.py)
    Key(
        "modal.cancel",
        "escape",
        "cancel",
        "Cancel",
        "note / tag prompt",
        "Close without saving.",
        palette=False,
        footer=True,
    ),
    Key(
        "modal.cancel-reject",
        "escape",
        "cancel",
        "Cancel",
        "reject dialog",
        "Close without rejecting.",
        palette=False,
        footer=True,
    ),
    Key("modal.confirm", "y", "confirm", "Yes", "confirm dialog", "Do it anyway.", palette=False, footer=True),
    Key(
        "modal.decline",
        "escape,n",
        "decline",
        "No",
        "confirm dialog",
        "Leave it as it was.",
        palette=False,
        footer=True,
    ),
    Key(
        "bulk.approve-all",
        "y",
        "approve_all",
        "Approve all",
        "bulk approve dialog",
        "Approve every marked sample (those with error findings as overrides).",
        palette=False,
        footer=True,
        label="All",
    ),
    Key(
        "bulk.approve-valid",
        "v",
        "approve_valid",
        "Only the valid",
        "bulk approve dialog",
        "Approve only the marked samples without error findings.",
        palette=False,
        footer=True,
        label="Valid",
    ),
    Key(
        "bulk.cancel",
        "escape,n",
        "decline",
        "No",
        "bulk approve dialog",
        "Approve none of them.",
        palette=False,
        footer=True,
    ),
    Key(
        "actions.cancel",
        "escape",
        "cancel",
        "Cancel",
        "undo list",
        "Close without undoing.",
        palette=False,
        footer=True,
    ),
    Key(
        "export.run",
        "ctrl+s",
        "run",
        "Export",
        "export dialog",
        "Write the export with these settings.",
        palette=False,
        footer=True,
    ),
    Key(
        "export.cancel",
        "escape",
        "cancel",
        "Close",
        "export dialog",
        "Close the export dialog (not while its export is writing: that one ends first, with its summary).",
        palette=False,
        footer=True,
    ),
    Key(
        "help.close",
        "escape,question_mark,q",
        "dismiss",
        "Close help",
        "help",
        "Close this screen.",
        palette=False,
        footer=True,
        label="Close",
    ),
    Key(
        "help.first",
        "home",
        "first_row",
        "First row",
        "help",
        "Scroll to the top.",
        palette=False,
        priority=True,
        footer=True,
        label="Top",
    ),
    Key(
        "help.last",
        "end",
        "last_row",
        "Last row",
        "help",
        "Scroll to the bottom.",
        palette=False,
        priority=True,
        footer=True,
        label="Last",
    ),
)

SCOPES: dict[str, tuple[str, ...]] = {
    "samples list": ("everywhere", "samples", "sample list"),
    "inspect": ("everywhere", "inspect", "token panes"),
    "generate": ("everywhere", "generate"),
    "doctor": ("everywhere", "doctor"),
    "stats": ("everywhere", "stats"),
    "compare": ("everywhere", "compare", "token panes"),
    "sessions": ("everywhere", "sessions"),
    "session turns": ("everywhere", "session turns"),
    "note / tag prompt": ("note / tag prompt",),
    "reject dialog": ("reject dialog",),
    "confirm dialog": ("confirm dialog",),
    "bulk approve dialog": ("bulk approve dialog",),
    "undo list": ("undo list",),
    "export dialog": ("export dialog",),
    "help": ("help",),
}
"""Groups whose keys are live at the same time: a key may be bound once per scope."""

GROUPS: tuple[str, ...] = tuple(dict.fromkeys(k.group for k in KEYS))
BY_ID: dict[str, Key] = {k.id: k for k in KEYS}


def bindings(group: str) -> list[BindingType]:
    """The Textual bindings of one group, for a screen's or widget's BINDINGS."""
    found: list[BindingType] = [k.binding() for k in KEYS if k.group == group]
    if not found:
        raise KeyError(f"no bindings in group {group!r}")
    return found


def binding_ids() -> set[str]:
    return set(BY_ID)


def normalize_key(key: str) -> str:
    """A key as Textual names it: '?' → 'question_mark', ']' → 'right_square_bracket'; names stay."""
    key = key.strip()
    if len(key) == 1 and not key.isalnum():
        try:
            return unicodedata.name(key).lower().replace(" ", "_").replace("-", "_")
        except ValueError:
            return key
    return key


def split_keys(keys: str) -> list[str]:
    return [normalize_key(k) for k in keys.split(",") if k.strip()]


def keys_of(key: Key, keymap: dict[str, str]) -> list[str]:
    return split_keys(keymap.get(key.id, key.keys))


FOCUS_KEYS = {"tab": "moves the focus to the next field", "shift+tab": "moves the focus back"}
"""Keys every Textual screen binds: an app-wide binding ("everywhere") remapped to one never runs (the
screen's comes first); a screen's or a widget's own binding does, before the screen's default."""
PRIORITY_KEYS = {"ctrl+q": "quits", "ctrl+p": "opens the command palette"}
"""Keys the Textual app takes before any screen or widget sees them (priority bindings)."""


def _taken_by_textual(keymap: dict[str, str]) -> str | None:
    """A remap to a key Textual's own binding takes first: accepted, it would do nothing (found by a curator)."""
    for binding_id, keys in keymap.items():
        key = BY_ID[binding_id]
        for name in split_keys(keys):
            if name in FOCUS_KEYS and key.group == "everywhere":
                why = f"{name} {FOCUS_KEYS[name]} in every screen first"
            elif name in PRIORITY_KEYS and not key.priority and (name != "ctrl+q" or key.group != "everywhere"):
                why = f"{name} {PRIORITY_KEYS[name]} before any screen sees it"
            else:
                continue
            return (
                f"keymap binds {name!r} to {binding_id}, but {why}, so {binding_id} would never run: choose another key"
            )
    return None


MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})


@lru_cache(maxsize=1)
def _key_names() -> frozenset[str]:
    """Every key name Textual sends (`enter`, `f5`, `pageup`, `question_mark`, …), without modifiers."""
    from textual.keys import KEY_NAME_REPLACEMENTS, Keys, _character_to_key

    names = {k.value.rsplit("+", 1)[-1] for k in Keys} | set(KEY_NAME_REPLACEMENTS.values())
    names |= {_character_to_key(chr(c)) for c in range(32, 127)}
    try:  # the kitty keyboard protocol's names (pause, menu, print_screen, f25 … f35, media and keypad keys)
        from textual._keyboard_protocol import FUNCTIONAL_KEYS, MODIFIER_FUNCTIONAL_KEYS

        names |= set(FUNCTIONAL_KEYS.values()) | set(MODIFIER_FUNCTIONAL_KEYS)
    except ImportError:  # a Textual without it: its names are refused, as unknown names are
        pass
    return frozenset(names | {"space", "enter", "tab", "backspace"})


def _names_a_character(name: str) -> bool:
    """`section_sign`, `plus_minus_sign`: the name Textual gives a key of any other character (its Unicode name, a
    space or a hyphen written `_`): the characters of keyboards (below U+3000) by Textual's own naming, any other by
    the name looked up."""
    import unicodedata

    if name in _keyboard_character_names():
        return True
    try:
        unicodedata.lookup(name.replace("_", " ").upper())
    except KeyError:
        return False
    return True


@lru_cache(maxsize=1)
def _keyboard_character_names() -> frozenset[str]:
    from textual.keys import _character_to_key

    return frozenset(_character_to_key(chr(c)) for c in range(0x20, 0x3000) if chr(c).isprintable())


def key_name_problem(name: str) -> str | None:
    """Why `name` is no key Textual could send (`a b`, `ctrl+shift+banana`: a binding no key reaches), or None."""
    if name == "+":
        return None
    *modifiers, base = name.split("+")
    odd = [m for m in modifiers if m not in MODIFIERS]
    if odd:
        return f"{odd[0]!r} is no modifier (ctrl, shift, alt, meta, super, hyper)"
    if (len(base) == 1 and base.isprintable() and not base.isspace()) or base in _key_names():
        return None
    if _names_a_character(base):
        return None
    return f"{base!r} is no key name (a key is a character, or a name such as enter, space, f5, pageup)"


def keymap_problem(keymap: dict[str, str]) -> str | None:
    """Why this keymap cannot be used (an unknown id, a key no keyboard sends, a key bound twice where both are
    live, a key Textual keeps for itself), or None."""
    unknown = sorted(set(keymap) - set(BY_ID))
    if unknown:
        return (
            f'keymap names unknown binding ids {unknown} (ids look like "curate.approve"; '
            f"the help screen, ?, lists them all)"
        )
    for binding_id, keys in keymap.items():  # accepted, such a binding had no key: its action could not be run
        for name in split_keys(keys):
            why = key_name_problem(name)
            if why is not None:
                return f"keymap binds {name!r} to {binding_id}: {why}"
    taken = _taken_by_textual(keymap)
    if taken:
        return taken
    for scope, groups in SCOPES.items():
        owner: dict[str, str] = {}
        for key in (k for k in KEYS if k.group in groups):
            for name in keys_of(key, keymap):
                if name in owner and owner[name] != key.id:
                    return f"keymap binds {name!r} to both {owner[name]} and {key.id} (both live in {scope})"
                owner[name] = key.id
    return None


SHOWN = {
    "question_mark": "?",
    "escape": "esc",
    "right_square_bracket": "]",
    "slash": "/",
    "enter": "⏎",
    "pageup": "pgup",
    "pagedown": "pgdn",
    "colon": ":",
    "greater_than_sign": ">",
    "asterisk": "*",
}


def display_keys(keys: list[str]) -> str:
    """Keys as a person reads them: 'esc ? q' rather than 'escape,question_mark,q'."""
    return " ".join(SHOWN.get(k, k.replace("ctrl+", "^")) for k in keys)


def key_hint(words: list[tuple[str, str]], keymap: dict[str, str]) -> str:
    """A dialog's line of keys, as remapped: `[("modal.confirm", "yes"), …]` → "y yes · esc / n no"."""
    return " · ".join(f"{' / '.join(display_keys(keys_of(BY_ID[i], keymap)).split())} {word}" for i, word in words)


def help_rows(keymap: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(where, keys, description, binding id) for every binding, keys as remapped by the keymap."""
    rows = []
    for k in KEYS:
        rows.append((k.group, display_keys(keys_of(k, keymap)), k.help or k.description, k.id))
    return rows
