#include "tools/conform/report.h"

#include <algorithm>
#include <functional>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proxy/events/event_log.h"
#include "proxy/version/version.h"
#include "tools/conform/expect.h"

namespace dpproxy::conform {

// Text for a terminal: control characters (a device ID of one byte, a
// plugin's message) as \xNN, never raw.
std::string Printable(absl::string_view text) {
  std::string out;
  for (unsigned char ch : text) {
    if (ch < 0x20 || ch == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

namespace {

// The releases and scenarios in the order the cells came.
std::vector<std::string> Ordered(const std::vector<CellResult>& cells,
                                 std::string CellResult::*field) {
  std::vector<std::string> out;
  for (const CellResult& c : cells) {
    if (std::find(out.begin(), out.end(), c.*field) == out.end()) out.push_back(c.*field);
  }
  return out;
}

// The cells as a grid: releases and scenarios in the order they came, each
// release's generation, and the cell of a scenario and release.
struct Grid {
  explicit Grid(const std::vector<CellResult>& cells)
      : kubelets(Ordered(cells, &CellResult::kubelet)),
        scenarios(Ordered(cells, &CellResult::scenario)) {
    for (const CellResult& c : cells) {
      at[{c.scenario, c.kubelet}] = &c;
      generation[c.kubelet] = c.generation;
    }
  }
  // nullptr where no cell ran.
  const CellResult* At(const std::string& scenario, const std::string& kubelet) const {
    auto it = at.find({scenario, kubelet});
    return it == at.end() ? nullptr : it->second;
  }
  std::vector<std::string> kubelets, scenarios;
  std::map<std::string, std::string> generation;
  std::map<std::pair<std::string, std::string>, const CellResult*> at;
};

std::string Mark(const CellResult& c) {
  if (!c.known.empty()) return "known";
  switch (c.outcome) {
    case Outcome::kPass: return "pass";
    case Outcome::kFail: return "FAIL";
    case Outcome::kBlocked: return "blocked";
    case Outcome::kNotApplicable: return "n/a";
  }
  return "?";
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 has no other control characters than tab, LF and CR.
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') {
          out += '?';
        } else {
          out += ch;
        }
    }
  }
  return out;
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.3f", absl::ToDoubleSeconds(d)); }

std::string Details(const CellResult& c) {
  std::string out;
  if (!c.plugin_did.empty()) absl::StrAppend(&out, "plugin did: ", c.plugin_did, "\n");
  if (!c.kubelet_expects.empty()) {
    absl::StrAppend(&out, "kubelet ", c.kubelet, " expects: ", c.kubelet_expects, "\n");
  }
  if (!c.users_see.empty()) absl::StrAppend(&out, "users see: ", c.users_see, "\n");
  if (!c.known.empty()) absl::StrAppend(&out, "known limitation: ", c.known, "\n");
  if (!c.fixed.empty()) {
    absl::StrAppend(&out, "declared a failure, now passes: ", c.fixed, "\n");
  }
  for (const std::string& n : c.notes) absl::StrAppend(&out, "note: ", n, "\n");
  if (!c.dir.empty()) absl::StrAppend(&out, "files: ", c.dir, "\n");
  return out;
}

}  // namespace

Totals Count(const std::vector<CellResult>& cells) {
  Totals t;
  for (const CellResult& c : cells) {
    switch (c.outcome) {
      case Outcome::kPass: ++t.passed; break;
      case Outcome::kFail: ++t.failed; break;
      case Outcome::kBlocked: ++t.blocked; break;
      case Outcome::kNotApplicable: ++t.not_applicable; break;
    }
    t.known += !c.known.empty();
    t.fixed += !c.fixed.empty();
  }
  return t;
}

std::string TotalsLine(const std::vector<CellResult>& cells) {
  const Totals t = Count(cells);
  std::string out = absl::StrCat(cells.size(), " cells: ", t.passed, " passed, ", t.failed,
                                 " failed, ", t.blocked, " blocked, ", t.not_applicable,
                                 " not applicable");
  if (t.known > 0 || t.fixed > 0) {
    absl::StrAppend(&out, "; ", t.known, " of the failed and blocked known (--expect), ", t.fixed,
                    " declared failure(s) now passing");
  }
  return out;
}

namespace {

// The table's columns: one per release; or, where that would be wider
// than kTableWidth, one per kubelet generation (releases that behave
// alike), headed by the first and last release run, each cell the marks
// of its releases ("pass", or "pass/FAIL" where they differ).
constexpr size_t kTableWidth = 120;

struct Column {
  std::string header;
  std::vector<std::string> kubelets;
};

std::vector<Column> Columns(const std::vector<CellResult>& cells, size_t first) {
  const std::vector<std::string> kubelets = Ordered(cells, &CellResult::kubelet);
  std::vector<Column> per_release;
  size_t width = first;
  for (const std::string& k : kubelets) {
    per_release.push_back({k, {k}});
    width += 2 + std::max<size_t>(k.size(), 7);
  }
  if (width <= kTableWidth) return per_release;
  std::map<std::string, std::string> generation;
  for (const CellResult& c : cells) generation[c.kubelet] = c.generation;
  std::vector<Column> grouped;
  for (const std::string& k : kubelets) {
    if (grouped.empty() || generation[grouped.back().kubelets.front()] != generation[k]) {
      grouped.push_back({k, {}});
    }
    grouped.back().kubelets.push_back(k);
    if (grouped.back().kubelets.size() > 1) {
      grouped.back().header = absl::StrCat(grouped.back().kubelets.front(), "-", k);
    }
  }
  return grouped;
}

std::string ColumnMark(const std::map<std::pair<std::string, std::string>, const CellResult*>& at,
                       const std::string& scenario, const Column& column) {
  std::vector<std::string> marks;
  for (const std::string& k : column.kubelets) {
    auto it = at.find({scenario, k});
    if (it == at.end()) continue;
    const std::string m = Mark(*it->second);
    if (std::find(marks.begin(), marks.end(), m) == marks.end()) marks.push_back(m);
  }
  return absl::StrJoin(marks, "/");
}

// Appends `title` on a line of its own after an empty one, then the text
// `line` gives each cell (empty: none); nothing at all when no cell gives
// any.
void AppendSection(std::string* out, absl::string_view title,
                   const std::vector<CellResult>& cells,
                   const std::function<std::string(const CellResult&)>& line) {
  std::string body;
  for (const CellResult& c : cells) body += line(c);
  if (!body.empty()) absl::StrAppend(out, "\n", title, "\n", body);
}

}  // namespace

std::string RenderTable(const std::vector<CellResult>& cells) {
  const std::vector<std::string> scenarios = Ordered(cells, &CellResult::scenario);
  std::map<std::pair<std::string, std::string>, const CellResult*> at;
  for (const CellResult& c : cells) at[{c.scenario, c.kubelet}] = &c;
  size_t first = std::string("scenario").size();
  for (const std::string& s : scenarios) first = std::max(first, s.size());
  const std::vector<Column> columns = Columns(cells, first);
  std::vector<size_t> widths;
  for (const Column& col : columns) {
    size_t w = std::max<size_t>(col.header.size(), 7);
    for (const std::string& s : scenarios) w = std::max(w, ColumnMark(at, s, col).size());
    widths.push_back(w);
  }

  std::string out = absl::StrFormat("%-*s", first, "scenario");
  for (size_t i = 0; i < columns.size(); ++i) {
    absl::StrAppendFormat(&out, "  %-*s", widths[i], columns[i].header);
  }
  out += "\n";
  for (const std::string& s : scenarios) {
    absl::StrAppendFormat(&out, "%-*s", first, s);
    for (size_t i = 0; i < columns.size(); ++i) {
      absl::StrAppendFormat(&out, "  %-*s", widths[i], ColumnMark(at, s, columns[i]));
    }
    out += "\n";
  }
  if (columns.size() < Ordered(cells, &CellResult::kubelet).size()) {
    out += "(a column per kubelet generation, its first and last release run; the failures "
           "below name each release)\n";
  }
  AppendSection(&out, "Failures:", cells, [](const CellResult& c) {
    if (c.outcome != Outcome::kFail || !c.known.empty()) return std::string();
    std::string text = absl::StrCat("\n", c.scenario, " on kubelet ", c.kubelet, " (",
                                    c.generation, "): ", Printable(c.summary), "\n");
    for (absl::string_view line : absl::StrSplit(Details(c), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&text, "  ", Printable(line), "\n");
    }
    return text;
  });
  AppendSection(&out, "Blocked (by the failure named):", cells, [](const CellResult& c) {
    if (c.outcome != Outcome::kBlocked || !c.known.empty()) return std::string();
    return absl::StrCat("  ", c.scenario, " on kubelet ", c.kubelet, ": ", Printable(c.summary),
                        "\n");
  });
  AppendSection(&out, "Known limitations (--expect; not counted against the run):", cells,
                [](const CellResult& c) {
                  if (c.known.empty()) return std::string();
                  if (c.outcome == Outcome::kBlocked && absl::StartsWith(c.known, "blocked by ")) {
                    // Its reason is the blocking failure's, listed with it.
                    return absl::StrCat("  ", c.scenario, " on kubelet ", c.kubelet,
                                        " (blocked by ", c.blocked_by, ")\n");
                  }
                  return absl::StrCat("  ", c.scenario, " on kubelet ", c.kubelet, " (",
                                      c.outcome == Outcome::kBlocked ? "blocked" : "FAIL", "): ",
                                      Printable(c.summary), "\n    ", Printable(c.known), "\n");
                });
  AppendSection(&out, "Declared failures that now pass (take them out of the --expect file):",
                cells, [](const CellResult& c) {
                  if (c.fixed.empty()) return std::string();
                  return absl::StrCat("  ", c.scenario, " on kubelet ", c.kubelet, ": ",
                                      Printable(c.fixed), "\n");
                });
  absl::StrAppend(&out, "\n", TotalsLine(cells), "\n");
  return out;
}

std::string RenderJson(const ConformOptions& options, const std::vector<CellResult>& cells,
                       absl::Duration wall) {
  Json j;
  j["plugin"] = options.plugin_command;
  j["resources"] = options.resources;
  j["kubelets"] = Ordered(cells, &CellResult::kubelet);
  j["scenarios"] = Ordered(cells, &CellResult::scenario);
  Json list = Json::array();
  for (const CellResult& c : cells) {
    Json e = {{"kubelet", c.kubelet},
              {"generation", c.generation},
              {"scenario", c.scenario},
              {"outcome", OutcomeName(c.outcome)},
              {"summary", c.summary},
              {"seconds", absl::ToDoubleSeconds(c.duration)},
              {"notes", c.notes}};
    if (!c.plugin_did.empty()) e["plugin_did"] = c.plugin_did;
    if (!c.kubelet_expects.empty()) e["kubelet_expects"] = c.kubelet_expects;
    if (!c.users_see.empty()) e["users_see"] = c.users_see;
    if (!c.blocked_by.empty()) e["blocked_by"] = c.blocked_by;
    if (!c.dir.empty()) e["dir"] = c.dir;
    if (!c.known.empty()) e["known"] = c.known;
    if (!c.fixed.empty()) e["fixed"] = c.fixed;
    list.push_back(e);
  }
  j["cells"] = list;
  const Totals t = Count(cells);
  j["totals"] = {{"cells", cells.size()},
                 {"passed", t.passed},
                 {"failed", t.failed},
                 {"blocked", t.blocked},
                 {"not_applicable", t.not_applicable},
                 {"known", t.known},
                 {"fixed", t.fixed}};
  if (wall > absl::ZeroDuration()) j["wall_seconds"] = absl::ToDoubleSeconds(wall);
  return j.dump(2) + "\n";
}

namespace {

// One <testcase>: a failure, or a blocked cell (a failure too: dpconform
// counts it as one, the scenario it needed failed), carries its reason;
// a cell that does not apply is skipped with its reason.
std::string JUnitCase(const std::string& kubelet, const CellResult& c) {
  std::string out = absl::StrCat("    <testcase classname=\"dpconform.kubelet-", XmlEscape(kubelet),
                                 "\" name=\"", XmlEscape(c.scenario), "\" time=\"",
                                 Seconds(c.duration), "\"");
  if (!c.known.empty()) {
    // Declared by the plugin's authors: not a failure of this run.
    return absl::StrCat(out, ">\n      <skipped message=\"",
                        XmlEscape(absl::StrCat("known limitation (", c.known, "): ", c.summary)),
                        "\"/>\n    </testcase>\n");
  }
  switch (c.outcome) {
    case Outcome::kPass: {
      std::vector<std::string> lines = c.notes;
      if (!c.fixed.empty()) lines.push_back(absl::StrCat("declared a failure, now passes: ", c.fixed));
      if (lines.empty()) return out + "/>\n";
      return absl::StrCat(out, ">\n      <system-out>", XmlEscape(absl::StrJoin(lines, "\n")),
                          "</system-out>\n    </testcase>\n");
    }
    case Outcome::kFail:
      return absl::StrCat(out, ">\n      <failure message=\"", XmlEscape(c.summary),
                          "\" type=\"conformance\">", XmlEscape(Details(c)),
                          "</failure>\n    </testcase>\n");
    case Outcome::kBlocked:
      return absl::StrCat(out, ">\n      <failure message=\"",
                          XmlEscape(absl::StrCat("blocked: ", c.summary)),
                          "\" type=\"blocked\">",
                          XmlEscape(absl::StrCat("not run: it needs ", c.blocked_by,
                                                 ", which failed on this release")),
                          "</failure>\n    </testcase>\n");
    case Outcome::kNotApplicable:
      return absl::StrCat(out, ">\n      <skipped message=\"",
                          XmlEscape(absl::StrCat("not applicable: ", c.summary)),
                          "\"/>\n    </testcase>\n");
  }
  return out + "/>\n";
}

}  // namespace

std::string RenderJUnit(const ConformOptions& options, const std::vector<CellResult>& cells) {
  const Totals all = Count(cells);
  absl::Duration total;
  for (const CellResult& c : cells) total += c.duration;
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  // <testsuites> carries no skipped count: the common schema has none there.
  absl::StrAppend(&out, "<testsuites name=\"dpconform\" tests=\"", cells.size(),
                  "\" failures=\"", all.failed + all.blocked - all.known, "\" errors=\"0\" time=\"",
                  Seconds(total), "\">\n");
  for (const std::string& k : Ordered(cells, &CellResult::kubelet)) {
    std::vector<const CellResult*> mine;
    absl::Duration time;
    for (const CellResult& c : cells) {
      if (c.kubelet == k) {
        mine.push_back(&c);
        time += c.duration;
      }
    }
    int failures = 0, skipped = 0;
    for (const CellResult* c : mine) {
      failures += NewFailure(*c);
      skipped += c->outcome == Outcome::kNotApplicable || !c->known.empty();
    }
    absl::StrAppend(&out, "  <testsuite name=\"kubelet ", XmlEscape(k), " (",
                    XmlEscape(mine.front()->generation), ")\" tests=\"", mine.size(),
                    "\" failures=\"", failures, "\" errors=\"0\" skipped=\"", skipped,
                    "\" time=\"", Seconds(time), "\">\n");
    absl::StrAppend(&out, "    <properties>\n",
                    "      <property name=\"plugin\" value=\"", XmlEscape(options.plugin_command),
                    "\"/>\n",
                    "      <property name=\"kubelet\" value=\"", XmlEscape(k), "\"/>\n",
                    "      <property name=\"dpconform_version\" value=\"", kDpproxyVersion,
                    "\"/>\n",
                    "    </properties>\n");
    for (const CellResult* c : mine) out += JUnitCase(k, *c);
    out += "  </testsuite>\n";
  }
  out += "</testsuites>\n";
  return out;
}

namespace {

// Text as a Markdown table cell or list item shows it: one line, no
// column breaks, no markup.
std::string MarkdownText(absl::string_view text) {
  std::string out;
  for (char ch : Printable(text)) {
    if (ch == '\n') {
      out += ' ';
    } else if (ch == '|' || ch == '*' || ch == '_' || ch == '`' || ch == '<' || ch == '>' ||
               ch == '[' || ch == ']' || ch == '\\') {
      out += '\\';
      out += ch;
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

std::string RenderMarkdown(const ConformOptions& options, const std::vector<CellResult>& cells) {
  const Grid g(cells);
  const std::vector<std::string>& kubelets = g.kubelets;
  const std::vector<std::string>& scenarios = g.scenarios;
  std::string out = absl::StrCat("## dpconform: ", MarkdownText(options.plugin_command), "\n\n",
                                 TotalsLine(cells), "\n\n| kubelet |");
  for (const std::string& s : scenarios) absl::StrAppend(&out, " ", s, " |");
  out += "\n|---|";
  for (size_t i = 0; i < scenarios.size(); ++i) out += "---|";
  out += "\n";
  for (const std::string& k : kubelets) {
    absl::StrAppend(&out, "| ", k, " (", g.generation.at(k), ") |");
    for (const std::string& s : scenarios) {
      const CellResult* c = g.At(s, k);
      std::string mark;
      if (c != nullptr && !c->known.empty()) {
        mark = "known";
      } else if (c != nullptr) {
        switch (c->outcome) {
          case Outcome::kPass: mark = "pass"; break;
          case Outcome::kFail: mark = "**FAIL**"; break;
          case Outcome::kBlocked: mark = "blocked"; break;
          case Outcome::kNotApplicable: mark = "n/a"; break;
        }
      }
      absl::StrAppend(&out, " ", mark, " |");
    }
    out += "\n";
  }
  bool header = false;
  for (const CellResult& c : cells) {
    if (c.outcome != Outcome::kFail && c.outcome != Outcome::kBlocked) continue;
    if (!header) {
      out += "\n### Failed and blocked\n\n";
      header = true;
    }
    absl::StrAppend(&out, "- **", c.scenario, " on ", c.kubelet, "** (",
                    c.outcome == Outcome::kFail ? "failed" : "blocked",
                    c.known.empty() ? "" : ", known", "): ",
                    MarkdownText(c.summary), "\n");
    for (absl::string_view line : absl::StrSplit(Details(c), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "  - ", MarkdownText(line), "\n");
    }
  }
  return out;
}

namespace {

// Text inside an HTML element or a quoted attribute: line breaks stay
// (a <pre> and a title show them), other control characters as \xNN.
std::string HtmlText(absl::string_view text) {
  std::string out;
  for (const char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      case '\n': out += '\n'; break;
      default: out += Printable(absl::string_view(&ch, 1));
    }
  }
  return out;
}

// A cell's id for links from the grid to its text below.
std::string CellId(const CellResult& c) {
  std::string id = absl::StrCat("cell-", c.kubelet, "-", c.scenario);
  for (char& ch : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '-') ch = '-';
  }
  return id;
}

constexpr char kHtmlStyle[] =
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "th,td{border:1px solid #bbb;padding:3px 6px;text-align:center;font-size:90%}"
    "th.k{text-align:left}td.pass{background:#c8e6c9}td.fail{background:#ef9a9a;"
    "font-weight:bold}td.blocked{background:#ffcc80}td.na{background:#eee;color:#777}"
    "td.known{background:#fff59d}"
    "li{margin-bottom:.6em}pre{margin:.2em 0;white-space:pre-wrap}";

std::string HtmlClass(Outcome o) {
  switch (o) {
    case Outcome::kPass: return "pass";
    case Outcome::kFail: return "fail";
    case Outcome::kBlocked: return "blocked";
    case Outcome::kNotApplicable: return "na";
  }
  return "";
}

}  // namespace

std::string RenderHtml(const ConformOptions& options, const std::vector<CellResult>& cells) {
  const Grid g(cells);
  const std::vector<std::string>& kubelets = g.kubelets;
  const std::vector<std::string>& scenarios = g.scenarios;
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>dpconform: ",
      HtmlText(options.plugin_command), "</title><style>", kHtmlStyle,
      "</style></head><body>\n<h1>dpconform</h1>\n<p><code>", HtmlText(options.plugin_command),
      "</code></p>\n<p>", HtmlText(TotalsLine(cells)), "</p>\n<table>\n<tr><th>kubelet</th>");
  for (const std::string& s : scenarios) absl::StrAppend(&out, "<th>", HtmlText(s), "</th>");
  out += "</tr>\n";
  for (const std::string& k : kubelets) {
    absl::StrAppend(&out, "<tr><th class=\"k\">", HtmlText(k), " (", HtmlText(g.generation.at(k)),
                    ")</th>");
    for (const std::string& s : scenarios) {
      if (g.At(s, k) == nullptr) {
        out += "<td></td>";
        continue;
      }
      const CellResult& c = *g.At(s, k);
      const std::string mark = HtmlText(Mark(c));
      const bool listed = c.outcome == Outcome::kFail || c.outcome == Outcome::kBlocked;
      absl::StrAppend(&out, "<td class=\"", c.known.empty() ? HtmlClass(c.outcome) : "known",
                      "\" title=\"",
                      HtmlText(absl::StrCat(c.summary, "\n", Details(c))), "\">",
                      listed ? absl::StrCat("<a href=\"#", CellId(c), "\">", mark, "</a>") : mark,
                      "</td>");
    }
    out += "</tr>\n";
  }
  out += "</table>\n";
  bool header = false;
  for (const CellResult& c : cells) {
    if (c.outcome != Outcome::kFail && c.outcome != Outcome::kBlocked) continue;
    if (!header) {
      out += "<h2>Failed and blocked</h2>\n<ul>\n";
      header = true;
    }
    absl::StrAppend(&out, "<li id=\"", CellId(c), "\"><b>", HtmlText(c.scenario), " on ",
                    HtmlText(c.kubelet), "</b> (",
                    c.outcome == Outcome::kFail ? "failed" : "blocked",
                    c.known.empty() ? "" : ", known", "): ",
                    HtmlText(c.summary), "<pre>", HtmlText(Details(c)), "</pre>");
    if (!c.dir.empty()) {
      absl::StrAppend(&out, "kept in <code>", HtmlText(c.dir),
                      "</code> (the plugin's output in plugin.log)");
    }
    out += "</li>\n";
  }
  if (header) out += "</ul>\n";
  out += "</body></html>\n";
  return out;
}

}  // namespace dpproxy::conform
