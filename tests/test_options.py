"""The log folders a run makes, and removes again when it started nothing: never one that
existed before it, nor one that holds anything."""

from rankguard.options import missing_dirs, remove_empty_dirs


def test_the_folders_missing_are_the_path_and_its_missing_parents_outermost_first(tmp_path):
    assert missing_dirs(str(tmp_path / "a" / "b")) == (str(tmp_path / "a"),
                                                       str(tmp_path / "a" / "b"))
    assert missing_dirs(str(tmp_path)) == ()


def test_removing_them_keeps_a_folder_that_holds_anything_and_every_folder_above_it(tmp_path):
    made = missing_dirs(str(tmp_path / "a" / "b" / "c"))
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "someone_elses").write_text("keep\n")
    remove_empty_dirs(made)
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["someone_elses"]
    (tmp_path / "a" / "b" / "someone_elses").unlink()
    remove_empty_dirs(made)
    assert list(tmp_path.iterdir()) == []  # tmp_path itself existed before: kept
