"""Documents: what the semantic index knows about an agent, and the text built from it.

An agent contributes one document per capability plus one for its plain-language description
(``capability=None``). From all of them together the index also builds the agent level: its BM25
text (:func:`agent_lexical_text`: display name, description and every capability's name,
description, tags and examples) and its vector (the mean of its description's, capabilities' and
example requests' vectors, see ``semantic/search.py``), so that an agent is found by what it is
as a whole, not only by its best single capability. The texts handed to the embedder and to BM25 are
built here, in one place, so that the format chosen by measurement (see ``bench/semantic.py``)
applies everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Document",
    "TextFormat",
    "DEFAULT_TEXT_FORMAT",
    "embedding_text",
    "lexical_text",
    "embedding_query",
    "agent_lexical_text",
    "humanize_name",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Document:
    """One searchable unit: a capability of an agent, or the agent's description (a slotted
    dataclass: the index holds two per agent, and a pydantic model cost ~1.2 KiB each).

    ``doc_id`` must be unique across all owners; :meth:`for_capability` and
    :meth:`for_description` build conventional ids (``"<owner_id>#<capability>[@<version>]"``
    and ``"<owner_id>#"``). ``capability`` is None for the agent-description document.
    """

    # No length caps beyond non-empty ids: the registry validates registrations at its boundary,
    # and the embedder truncates long text to the model's window (256 word pieces) by itself.
    doc_id: str
    owner_id: str
    capability: str | None = None
    title: str = ""
    text: str = ""
    tags: tuple[str, ...] = ()  # lists are accepted and frozen into tuples
    examples: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.doc_id or not self.owner_id:
            raise ValueError("a document needs a non-empty doc_id and owner_id")
        object.__setattr__(self, "tags", tuple(self.tags))
        object.__setattr__(self, "examples", tuple(self.examples))

    @classmethod
    def for_capability(
        cls,
        *,
        owner_id: str,
        name: str,
        description: str = "",
        tags: list[str] | tuple[str, ...] = (),
        examples: list[str] | tuple[str, ...] = (),
        version: str | None = None,
    ) -> Document:
        """A capability document titled by the capability name (e.g. ``translate.text``).

        Pass ``version`` when an agent offers the same capability name at several versions,
        so that their doc ids differ.
        """
        return cls(
            doc_id=f"{owner_id}#{name}@{version}" if version else f"{owner_id}#{name}",
            owner_id=owner_id,
            capability=name,
            title=name,
            text=description,
            tags=tuple(tags),
            examples=tuple(examples),
        )

    @classmethod
    def for_description(cls, *, owner_id: str, title: str, description: str) -> Document:
        """The agent-description document (``capability=None``), titled by the display name."""
        return cls(
            doc_id=f"{owner_id}#",
            owner_id=owner_id,
            capability=None,
            title=title,
            text=description,
        )


class TextFormat(str, Enum):
    """How a document is flattened into the text that gets embedded.

    Capability documents, measured on ``tests/data/semantic_eval.json`` with all-MiniLM-L6-v2,
    vector-only ranking of capabilities alone (MRR over 126 queries): ``NAME_DESCRIPTION``
    0.934, ``DESCRIPTION_ONLY`` 0.918, ``FULL`` 0.910, ``LABELLED`` 0.899: tags and examples
    dilute the single vector of a short capability with keyword lists. The agent-level text is
    formatted separately (``SemanticSearch(agent_text_format=...)``); see ``bench/semantic.py``.
    """

    DESCRIPTION_ONLY = "description_only"  # the description alone
    NAME_DESCRIPTION = "name_description"  # "translate text: Translate a piece of text ..."
    FULL = "full"  # name + description, then tags and each example as sentences
    LABELLED = "labelled"  # name + description, "Tags: ...", "Examples: ..."


DEFAULT_TEXT_FORMAT = TextFormat.NAME_DESCRIPTION

_NAME_SEPARATORS = re.compile(r"[._:/\-]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def humanize_name(name: str) -> str:
    """``translate.text`` / ``image:search`` / ``ocr_receipt`` / ``getWeather`` -> plain words."""
    spaced = _CAMEL_BOUNDARY.sub(" ", name)
    spaced = _NAME_SEPARATORS.sub(" ", spaced).replace("_", " ")
    return " ".join(spaced.split()).lower()


def _sentence(text: str) -> str:
    text = text.strip()
    if text and text[-1] not in ".!?":
        text += "."
    return text


def embedding_text(document: Document, text_format: TextFormat = DEFAULT_TEXT_FORMAT) -> str:
    """The text the embedder sees for ``document`` under ``text_format``."""
    title = humanize_name(document.title) if document.capability is not None else document.title
    if text_format is TextFormat.DESCRIPTION_ONLY:
        return document.text or title
    if text_format is TextFormat.NAME_DESCRIPTION:
        return f"{title}: {document.text}" if document.text else title
    parts = [_sentence(f"{title}: {document.text}" if document.text else title)]
    if text_format is TextFormat.LABELLED:
        if document.tags:
            parts.append(_sentence("Tags: " + ", ".join(document.tags)))
        if document.examples:
            parts.append(_sentence("Examples: " + "; ".join(document.examples)))
    else:
        if document.tags:
            parts.append(_sentence(", ".join(document.tags)))
        parts.extend(_sentence(example) for example in document.examples)
    return " ".join(parts)


# Request boilerplate that opens a query ("can you", "I need someone to", "is there an agent that
# can"): it names no job, and a sentence model's single vector of a short query is diluted by it.
# The lexical side drops such words as stopwords already.
_REQUEST_OPENING = re.compile(
    r"^\s*(?:(?:please|hey|hi|hello)[,.!:]?\s+)*"
    r"(?:(?:can|could|would|will) (?:you|someone|somebody|anyone|anybody)(?: please)?\s+"
    r"|(?:i|we) (?:need|want|would like|'d like|wanna)(?: (?:to|someone to|something to|a way to|an agent to|you to))?\s+"
    r"|help me(?: to)?\s+"
    r"|is there (?:an agent|something|anything|a tool|a way)(?: that| which| to)?(?: can| could)?\s+"
    r"|(?:who|what) can\s+"
    r"|how (?:do|can|could|would) (?:i|we|you)\s+"
    r"|please\s+)?",
    re.IGNORECASE,
)
_SHORTEST_QUERY = 3


def embedding_query(query: str) -> str:
    """The text the embedder sees for a query: without a request opening ("could you please",
    "I need someone to", "is there an agent that can"); the query itself if little would be left."""
    stripped = _REQUEST_OPENING.sub("", query, count=1).strip()
    return stripped if len(stripped) >= _SHORTEST_QUERY else query


def agent_lexical_text(documents: Sequence[Document]) -> str:
    """The agent-level text BM25 indexes: every field of every document of the agent."""
    return "\n".join(lexical_text(document) for document in documents)


def lexical_text(document: Document) -> str:
    """The text BM25 indexes: name (raw, so its tokenizer splits it), title, description, tags, examples."""
    fields = [document.title, document.text, " ".join(document.tags), " ".join(document.examples)]
    if document.capability is not None and document.capability != document.title:
        fields.insert(0, document.capability)
    return "\n".join(field for field in fields if field)
