"""Fixtures shared by the test modules."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One CPU thread for a module whose tensors are tiny: a second thread costs more than it saves
    (much more on a busy machine). A module asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def email_splits():
    """The SpamAssassin corpus's train, valid and test splits, read once per test process: parsing
    every email takes about 10 s, and several tests of committed runs need them."""
    from transformer.tasks.email import read_emails, split_emails

    return split_emails(read_emails())
