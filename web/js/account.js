// Who is signed in, in the header (`GET /api/whoami`: the name, and "operator"), and Sign out.
// Without identities the API answers for the local user (`via: local`): there is no key to
// forget, so no Sign out.
import { onSignIn, signOut, whoami } from "./api.js";

export class Account {
  constructor() {
    this.box = document.getElementById("account");
    this.name = document.getElementById("account-name");
    this.role = document.getElementById("account-role");
    this.signOut = document.getElementById("sign-out");
    this.signOut.addEventListener("click", signOut);
    onSignIn((me) => this.show(me));
  }

  async load() {
    try {
      this.show(await whoami());
    } catch {
      // Left as it was: the page works without the name.
    }
  }

  show(me) {
    this.name.textContent = me.name;
    this.role.hidden = !me.operator;
    this.signOut.hidden = me.via === "local";
    this.box.hidden = false;
  }
}
