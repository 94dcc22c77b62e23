// The token page's copy button: the new key to the clipboard (it is shown only once).
const key = document.getElementById("new-token");
const result = document.getElementById("copy-result");

document.getElementById("copy-token").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(key.textContent.trim());
    result.textContent = "copied";
  } catch {
    // no clipboard access (an insecure origin): select the key for Ctrl-C instead
    getSelection().selectAllChildren(key);
    result.textContent = "selected: press Ctrl-C";
  }
});
