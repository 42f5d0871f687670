"""The store deleted or replaced under the open app (another process's doing): keys that read or write it say so in a
notification and the app goes on. `*`, `M`, and `a` on a row the new store lacks crashed it (an uncaught StoreError,
an UnknownSample)."""

from __future__ import annotations

import os
import shutil

from ui.helpers import settle

from tokview.store import Store
from tokview.ui.screens.samples import SamplesScreen


async def test_keys_on_a_store_replaced_or_deleted_are_notifications(make_app, store, tmp_path):
    other = tmp_path / "other.duckdb"
    with Store(other):
        pass
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        path = store.path
        store._file.release(force=True)  # past its linger, as another process would find it
        shutil.copyfile(other, path)  # another store now: the listed rows are not in it
        await pilot.press("a")
        await settle(app, pilot)
        store._file.release(force=True)
        os.remove(path)
        with open(path, "wb") as garbage:  # and then not a store at all
            garbage.write(b"not a duckdb file" * 100)
        for key in ("*", "M"):
            await pilot.press(key)
            await settle(app, pilot)
            store._file.release(force=True)
        assert isinstance(app.screen, SamplesScreen)
        assert app._exception is None
        said = [n.message for n in app._notifications]
        assert any("is no longer in the store" in m for m in said), said
        assert sum(n.title == "store" for n in app._notifications) >= 2, said


async def test_opening_a_listed_sample_the_store_lost_says_so_not_a_bug(make_app, store, tmp_path):
    """enter on a row the replaced store lacks: the open worker's UnknownSample was told as "unexpected error … (a bug
    in tokview …)"."""
    other = tmp_path / "other.duckdb"
    with Store(other):
        pass
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        store._file.release(force=True)
        shutil.copyfile(other, store.path)
        await pilot.press("enter")
        await settle(app, pilot)
        store._file.release(force=True)
        assert isinstance(app.screen, SamplesScreen)
        said = [(n.title, n.message) for n in app._notifications]
        assert any(t == "store" and "is no longer in the store" in m for t, m in said), said
        assert not any("a bug in tokview" in m for _, m in said), said
