"""A chapter's cell together with the build plumbing that follows it: the tests that execute a
chapter's own cells to check what it glues need both, since ``python -m tools.format_chapters
--tag-plumbing`` moves a cell's ``glue()`` calls into ``remove-input`` cells right after it."""


def with_plumbing(cells: list, index: int) -> list:
    """``cells[index]`` and the code cells tagged ``remove-input`` that directly follow it."""
    taken = [cells[index]]
    for cell in cells[index + 1:]:
        if cell.cell_type != "code" or "remove-input" not in cell.metadata.get("tags", []):
            break
        taken.append(cell)
    return taken
