"""Every environment variable the engine reads is documented in docs/settings.md, the one place for settings.

The sources are scanned for getenv("NAME") with a literal name and for any string literal "SPILLWAY_..." (names
handed to a helper that reads them); each NAME must appear in settings.md as `NAME`. A knob added without its row
fails here, which is the point: users find settings in one place.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
GETENV = re.compile(r'\bgetenv\(\s*"([A-Za-z_][A-Za-z0-9_]*)"\s*\)')
PROJECT_LITERAL = re.compile(r'"(SPILLWAY_[A-Z0-9_]+)"')
SOURCES = ("*.h", "*.cpp", "*.cu", "*.cuh")


def env_names(text):
    return set(GETENV.findall(text)) | set(PROJECT_LITERAL.findall(text))


def names_read_by_the_sources():
    names = {}
    for pattern in SOURCES:
        for path in (ROOT / "src").rglob(pattern):
            for name in env_names(path.read_text(encoding="utf-8", errors="replace")):
                names.setdefault(name, path.relative_to(ROOT))
    return names


def test_the_sources_read_some_settings():
    # The scan itself works: the settings struct reads knobs, directly (SPILLWAY_CPU_SPIN_US) and through a
    # helper (SPILLWAY_PDL, SPILLWAY_ATTN_FUSED).
    names = names_read_by_the_sources()
    assert {"SPILLWAY_CPU_SPIN_US", "SPILLWAY_PDL", "SPILLWAY_ATTN_FUSED"} <= names.keys()


def test_only_base_reads_the_environment():
    # Settings are parsed once in src/base (settings.h) and passed down as values; kernels, the engine and the
    # rest never call getenv themselves.
    readers = sorted(str(path.relative_to(ROOT)) for pattern in SOURCES for path in (ROOT / "src").rglob(pattern)
                     if re.search(r"\bgetenv\s*\(", path.read_text(encoding="utf-8", errors="replace"))
                     and path.parent != ROOT / "src" / "base")
    assert not readers, "getenv outside src/base (read it in src/base/settings.cpp instead): " + ", ".join(readers)


def test_every_setting_the_sources_read_is_documented():
    documented = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    missing = sorted(f"{name} (read in {where})" for name, where in names_read_by_the_sources().items()
                     if f"`{name}`" not in documented)
    assert not missing, "not in docs/settings.md: " + ", ".join(missing)


def test_scanner_sees_a_getenv():
    assert env_names('const char* e = std::getenv("SPILLWAY_NEW_KNOB");') == {"SPILLWAY_NEW_KNOB"}
    assert env_names("getenv(name)") == set()
    assert env_names('static const bool on = env_switch_on("SPILLWAY_ATTN_FUSED");') == {"SPILLWAY_ATTN_FUSED"}
