"""The search facade's documents as held (semantic.holdings): an agent description of the
conventional id ``"<owner_id>#"`` is kept as its title and text alone, any other document as
given. After any churn the facade gives back the documents upserted, counts them, ranks every
query as a facade built afresh from the owners left, and keeps doc ids unique across owners
whichever form holds them."""

from __future__ import annotations

import random

import pytest

from semantic import Document, SemanticSearch
from semantic.errors import InvalidDocumentError

pytestmark = pytest.mark.unit

WORDS = ["invoice", "receipt", "translate", "speech", "text", "image", "search", "weather", "agent", "scale"]
QUERIES = ["translate text", "invoice receipt agent", "speech to text", "agent 17", "image search weather", "scale"]


def documents(rng: random.Random, owner: str) -> list[Document]:
    def words() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))

    held = [Document.for_capability(owner_id=owner, name=f"cap.c{rng.randrange(9)}", description=words(),
                                    version=str(rng.randint(1, 2))) for _ in range(rng.randint(0, 2))]
    held = list({document.doc_id: document for document in held}.values())
    kind = rng.random()
    if kind < 0.6:  # the conventional description, held without its id
        held.append(Document.for_description(owner_id=owner, title=f"agent {rng.randrange(30)}", description=words()))
    elif kind < 0.8:  # a description of another id, or with tags: held as given
        held.append(Document(doc_id=f"{owner}#about", owner_id=owner, title="about", text=words()))
        held.append(Document(doc_id=f"{owner}#", owner_id=owner, title="tagged", text=words(), tags=["x"]))
    return held


async def ranked(facade: SemanticSearch) -> list[list[tuple[str, float, str | None]]]:
    return [[(hit.owner_id, hit.score, hit.capability) for hit in (await facade.search(query, k=10)).hits]
            for query in QUERIES]


async def test_documents_after_churn_read_back_count_and_rank_as_a_fresh_facade() -> None:
    rng = random.Random(11)
    given: dict[str, list[Document]] = {}
    async with SemanticSearch(semantic_enabled=False) as facade:
        for _ in range(1_500):
            owner = f"r1/agent.a{rng.randrange(150)}"
            if owner in given and rng.random() < 0.3:
                assert facade.remove_owner(owner)
                del given[owner]
            else:
                new = documents(rng, owner)
                await facade.upsert_owner(owner, new)
                if new:
                    given[owner] = new
                else:
                    given.pop(owner, None)
        assert {owner: facade.documents_of(owner) for owner in facade.owners()} == given
        assert len(facade) == sum(map(len, given.values())) > 100
        held = facade._holdings._documents
        assert not any(doc_id.endswith("#") and not held[doc_id].tags for doc_id in held)
        async with SemanticSearch(semantic_enabled=False) as fresh:
            await fresh.upsert_owners(given)
            assert await ranked(facade) == await ranked(fresh)


async def test_a_doc_id_stays_one_owner_s_whichever_form_holds_it() -> None:
    async with SemanticSearch(semantic_enabled=False) as facade:
        await facade.upsert_owner("a", [Document.for_description(owner_id="a", title="agent a", description="x")])
        taken = Document(doc_id="a#", owner_id="b", capability="c.d", title="c.d", text="y")
        with pytest.raises(InvalidDocumentError, match="already belongs to 'a'"):
            await facade.upsert_owner("b", [taken])
        await facade.upsert_owner("b", [Document(doc_id="b#", owner_id="b", capability="c.d", title="c.d")])
        with pytest.raises(InvalidDocumentError, match="already belongs to 'b'"):
            await facade.upsert_owner("c", [Document(doc_id="b#", owner_id="c", title="t")])
        # A doc id moving between forms within one owner: a capability, then the description.
        await facade.upsert_owner("b", [Document.for_description(owner_id="b", title="agent b", description="z")])
        assert facade.documents_of("b") == [Document.for_description(owner_id="b", title="agent b", description="z")]
        assert "b#" not in facade._holdings._documents and len(facade) == 2
        facade.remove_owner("a")
        await facade.upsert_owner("b", [taken.__class__(doc_id="a#", owner_id="b", title="t")])
        assert facade.documents_of("b")[0].doc_id == "a#" and len(facade) == 1
