/* A copy button on every code block (not on program output).
 *
 * A console session copies its commands only: the lines after "$ ", with
 * their "\" continuations, without the prompt or the output shown under
 * them. Anything else copies the block's text as shown.
 */
"use strict";

function kvcoreCopyText(block) {
  const text = block.querySelector("pre").innerText;
  if (!block.parentElement.classList.contains("highlight-console")) {
    return text;
  }
  const commands = [];
  let continued = false;
  for (const line of text.split("\n")) {
    if (line.startsWith("$ ") || continued) {
      const command = line.startsWith("$ ") ? line.slice(2) : line;
      commands.push(command);
      continued = command.trimEnd().endsWith("\\");
    }
  }
  return commands.join("\n");
}

function kvcoreCopy(text) {
  if (navigator.clipboard && window.isSecureContext) {
    return navigator.clipboard.writeText(text);
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  const done = document.execCommand("copy");
  area.remove();
  return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("div.highlight").forEach((block) => {
    if (block.closest("div.output")) {
      return;
    }
    const button = document.createElement("button");
    button.type = "button";
    button.className = "kvcore-copy";
    button.textContent = "copy";
    button.setAttribute("aria-label", "copy the code to the clipboard");
    button.addEventListener("click", () => {
      kvcoreCopy(kvcoreCopyText(block)).then(
        () => { button.textContent = "copied"; },
        () => { button.textContent = "select and copy"; },
      );
      setTimeout(() => { button.textContent = "copy"; }, 1500);
    });
    block.classList.add("kvcore-has-copy");
    block.appendChild(button);
  });
});
