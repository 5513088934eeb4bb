import re
import shutil
import subprocess

import pytest

from reports_testkit import render

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_is_self_contained(scenario, tmp_path):
    html = (render(scenario, tmp_path) / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "report.html must not load anything"
    assert "@import" not in html and "url(" not in html
    for part in ("support matrix heatmap", "per-cell timeline", "metric trend", "<polyline"):
        assert part in html


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_html_renders_in_headless_chromium(scenario, tmp_path):
    from PIL import Image  # only needed here, to look at the screenshot

    page = render(scenario, tmp_path) / "report.html"
    screenshot = tmp_path / "report.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={screenshot}", "--window-size=1200,900", page.as_uri()],
        check=True, capture_output=True, timeout=60,
    )
    assert screenshot.exists()
    image = Image.open(screenshot).convert("RGB")
    assert image.size == (1200, 900)
    colours = image.getcolors(maxcolors=1 << 20)
    assert len(colours) > 20, "screenshot looks blank"
    # The heatmap's pass/fail colours must actually be on screen.
    present = {colour for _, colour in colours}
    assert (0x2D, 0xA4, 0x4E) in present and (0xCF, 0x22, 0x2E) in present
