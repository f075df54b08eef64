"""The JupyterLab fixture for every browser test (defined with its helpers in
test_widgets_render)."""

from tests.browser.test_widgets_render import jupyterlab  # noqa: F401 (a fixture)
