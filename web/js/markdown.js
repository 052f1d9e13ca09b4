// Model text is untrusted: it is rendered as Markdown, never run.
//
// marked turns Markdown into HTML; raw HTML in the text (a `<script>`, an
// `<img onerror=…>`) is escaped and shown as text rather than passed through, and
// DOMPurify then keeps only plain formatting elements and safe link targets
// (no `javascript:` URLs, no images that could carry data elsewhere, no styles).
// Code blocks are coloured by highlight.js after that, on the sanitised DOM: it reads
// each block's text and writes it back escaped, inside its own `<span class>`es.
import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const marked = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    // Block and inline HTML alike: as the characters the model wrote.
    html({ text }) {
      return escapeHtml(text);
    },
    // An image would be a request to wherever the model (or a page it read) says.
    image({ href, text }) {
      return escapeHtml(`![${text}](${href})`);
    },
  },
});

const ALLOWED_TAGS = [
  "a", "p", "br", "hr", "strong", "em", "del", "code", "pre", "blockquote",
  "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
  "table", "thead", "tbody", "tr", "th", "td", "input",
];
const ALLOWED_ATTR = ["href", "title", "start", "align", "class", "type", "checked", "disabled"];

const purifier = DOMPurify(window);
purifier.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.getAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
  if (node.tagName === "INPUT" && node.getAttribute("type") !== "checkbox") node.remove();
});

/** Safe HTML for `text` (Markdown). */
export function renderMarkdown(text) {
  return purifier.sanitize(marked.parse(text), {
    ALLOWED_TAGS,
    ALLOWED_ATTR: [...ALLOWED_ATTR, "target", "rel"],
  });
}

/** `markdown` as plain text on one line, markers gone: "**Plan** my `trip`" is "Plan my trip". */
export function plainText(markdown) {
  const template = document.createElement("template"); // inert: nothing in it loads or runs
  template.innerHTML = renderMarkdown(markdown);
  return template.content.textContent.replace(/\s+/g, " ").trim();
}

let highlighter = null;

// highlight.js is most of the page's script by size: it loads with the first code block,
// not before the page can show anything.
function loadHighlighter() {
  highlighter ??= import("../vendor/highlightjs/highlight.min.js").then((module) => module.default);
  return highlighter;
}

/**
 * Colour `code` (a sanitised block already in the page): in the language its class names
 * when highlight.js knows it, else in highlight.js's best guess. Resolves with the
 * language's name ("" when none fits).
 */
export async function highlightCode(code) {
  const hljs = await loadHighlighter();
  const named = /(?:^|\s)language-(\S+)/.exec(code.className);
  const language = named && hljs.getLanguage(named[1]) ? named[1] : null;
  const result = language
    ? hljs.highlight(code.textContent, { language, ignoreIllegals: true })
    : hljs.highlightAuto(code.textContent);
  code.innerHTML = result.value; // the text, escaped, in highlight.js's spans
  code.classList.add("hljs");
  if (result.language) code.dataset.language = result.language;
  return result.language || "";
}
