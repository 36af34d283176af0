// File: report.h
//
// dpconform's outputs: a table for people (scenarios down, kubelet releases
// across, then what each failure means), JSON for scripts, JUnit XML for
// CI systems (one suite per kubelet release, one case per scenario; a
// blocked cell is a failure, an n/a one <skipped>, each with the reason),
// Markdown for a CI job's summary page (releases down, scenarios across,
// then the failures), and one HTML file with nothing to fetch (the same
// grid, coloured, each cell's text on it and in a list below with the
// directory a failed cell was kept in).
#ifndef DPPROXY_TOOLS_CONFORM_REPORT_H_
#define DPPROXY_TOOLS_CONFORM_REPORT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "tools/conform/conform.h"

namespace dpproxy::conform {

struct Totals {
  int passed = 0, failed = 0, blocked = 0, not_applicable = 0;
  // Of the failed and blocked, those --expect declared known; of the
  // passed, those it declared failures.
  int known = 0, fixed = 0;
};
Totals Count(const std::vector<CellResult>& cells);
// "N cells: N passed, N failed, N blocked, N not applicable", and with
// --expect "; N of them known, N known failures now pass".
std::string TotalsLine(const std::vector<CellResult>& cells);

// Text for a terminal: control characters (a device ID of one byte, a
// plugin's message) as \xNN, never raw.
std::string Printable(absl::string_view text);

std::string RenderTable(const std::vector<CellResult>& cells);
// `wall`: the run's wall time, "wall_seconds" in the report where given.
std::string RenderJson(const ConformOptions& options, const std::vector<CellResult>& cells,
                       absl::Duration wall = absl::ZeroDuration());
std::string RenderJUnit(const ConformOptions& options, const std::vector<CellResult>& cells);
std::string RenderMarkdown(const ConformOptions& options, const std::vector<CellResult>& cells);
std::string RenderHtml(const ConformOptions& options, const std::vector<CellResult>& cells);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_REPORT_H_
