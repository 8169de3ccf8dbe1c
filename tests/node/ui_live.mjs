// A live run in a real browser (Debian's chromium driven by playwright-core), for
// tests/test_ui_browser.py: `aenv rollout` is running, held after HELD episodes; the browser
// watches the run on `aenv ui` (the run directory) and on the hub's page (the run the driver
// pushes there), prints "LIVE" once it saw it live on both (the test then lets the run go on),
// and watches both pages move to EPISODES episodes and `finished` without a reload. What it saw
// is printed as one JSON object on stdout's last line; the test asserts on it.
//
// Environment: UI_URL (aenv ui's printed URL), LOCAL_RUN (the run's name there), HUB_URL,
// HUB_KEY, HUB_RUN (the run's id on the hub), HELD, EPISODES, SHOTS (a directory), CHROMIUM.
import { chromium } from "playwright-core";

const env = process.env;
const out = { console: [], steps: {} };
const browser = await chromium.launch({
  executablePath: env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
const local = await context.newPage();
const hub = await context.newPage();
for (const page of [local, hub]) {
  page.setDefaultTimeout(60000);
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") out.console.push(`${m.type()}: ${m.text()}`); });
  page.on("pageerror", (e) => out.console.push(`pageerror: ${e.message}`));
}
const cards = (page) => page.locator(".card").allTextContents();
// the run page's cards say `state` and `episodes` (each card: its value, then its name)
const showing = (page, state, episodes, timeout) => page.waitForFunction(([s, n]) => {
  const texts = [...document.querySelectorAll(".card")].map((c) => c.textContent);
  return texts.includes(s + "state") && texts.includes(n + "episodes");
}, [state, String(episodes)], { timeout });
// how many times the page's episodes card changed value, without a reload (a page's own counter)
const watch = (page) => page.evaluate(() => {
  window.__seen = [];
  const look = () => {
    const card = [...document.querySelectorAll(".card")].find((c) => c.textContent.endsWith("episodes"));
    const value = card ? card.textContent.replace(/episodes$/, "") : null;
    if (value !== null && window.__seen[window.__seen.length - 1] !== value) window.__seen.push(value);
  };
  look();
  new MutationObserver(look).observe(document.getElementById("main"), { childList: true, subtree: true });
});
const seen = (page) => page.evaluate(() => window.__seen);

try {
  // -- aenv ui over the run directory: live, HELD episodes so far ---------------------------------
  await local.goto(env.UI_URL);
  await local.evaluate((run) => { location.hash = "#/run/" + encodeURIComponent(run); }, env.LOCAL_RUN);
  await showing(local, "live", env.HELD);
  out.steps.local_live = { heading: (await local.locator("h1").textContent()).trim(), cards: await cards(local), driver: await local.locator("h2:has-text('Driver') + dl").innerText() };
  await watch(local);
  await local.screenshot({ path: `${env.SHOTS}/live-run.png` });

  // -- the hub's page: the key, the Runs page, the run ---------------------------------------------
  await hub.goto(env.HUB_URL + "/ui/#/login");
  await hub.locator("input[name=key]").fill(env.HUB_KEY);
  await hub.keyboard.press("Enter");
  await hub.waitForFunction(() => document.querySelector("h1")?.textContent === "Environments");
  await hub.getByRole("link", { name: "Runs", exact: true }).click();
  const row = hub.locator("main table tbody tr", { has: hub.getByRole("link", { name: env.HUB_RUN, exact: true }) });
  await row.waitFor();
  await hub.waitForFunction(([id, n]) => [...document.querySelectorAll("main table tbody tr")].some((tr) => tr.textContent.startsWith(id + "live") && tr.children[5].textContent === n), [env.HUB_RUN, String(env.HELD)]);
  out.steps.hub_runs_live = {
    heading: (await hub.locator("h1").textContent()).trim(),
    row: await row.locator("td").allTextContents(),
  };
  await hub.screenshot({ path: `${env.SHOTS}/hub-runs.png` });
  await row.getByRole("link", { name: env.HUB_RUN, exact: true }).click();
  await showing(hub, "live", env.HELD);
  out.steps.hub_live = { heading: (await hub.locator("h1").textContent()).trim(), cards: await cards(hub), settings: await hub.locator("h2:has-text('Settings') + dl").innerText() };
  await watch(hub);
  await hub.screenshot({ path: `${env.SHOTS}/hub-run.png` });

  // -- let the run go on: both pages follow it to its end, without a reload -------------------------
  process.stdout.write("LIVE\n");
  await showing(hub, "finished", env.EPISODES, 300000);
  await showing(local, "finished", env.EPISODES, 300000);
  out.steps.hub_done = { cards: await cards(hub), seen: await seen(hub) };
  out.steps.local_done = { cards: await cards(local), seen: await seen(local) };
  await hub.getByRole("link", { name: "Runs", exact: true }).click();
  await hub.waitForFunction((id) => [...document.querySelectorAll("main table tbody tr")].some((tr) => tr.textContent.startsWith(id + "finished")), env.HUB_RUN);
  out.steps.hub_runs_done = { row: await hub.locator("main table tbody tr", { has: hub.getByRole("link", { name: env.HUB_RUN, exact: true }) }).locator("td").allTextContents() };
} catch (err) {
  out.error = String(err && err.stack || err);
  for (const [name, page] of [["aenv ui", local], ["hub", hub]]) {
    out.error += `\n--- ${name} (${page.url()}):\n` + (await page.locator("body").innerText().catch(() => "?")).slice(0, 1500);
  }
  await hub.screenshot({ path: `${env.SHOTS}/live-failure.png` }).catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
